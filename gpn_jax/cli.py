"""What every absl entry point shares: one-line errors with a non-zero exit."""

import sys

from gpn_jax.training.checkpointing import CheckpointError
from gpn_jax.training.loop import TrainingError

# Errors a user can cause (bad input, config, workdir); anything else is a bug and keeps its traceback.
USER_ERRORS = (
    ValueError,
    FileNotFoundError,
    NotADirectoryError,
    PermissionError,
    CheckpointError,
    TrainingError,
    KeyError,
)


def run_or_exit(fn, *args, prog: str = "gpn_jax", **kwargs):
    """Calls `fn`; a user error prints `<prog>: error: <one line>` and exits with status 1."""
    try:
        return fn(*args, **kwargs)
    except USER_ERRORS as e:
        msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        print(f"{prog}: error: {msg}", file=sys.stderr)
        sys.exit(1)
