"""The user-facing error classes, in a module that imports nothing.

`gpn_jax.io.cli` turns them into one-line messages; keeping them here lets every entry point
import the CLI without loading the trainer (orbax, tqdm). The old homes
(`checkpoints.manager.CheckpointError`, `training.loop.TrainingError`) re-export them.
"""


class CheckpointError(RuntimeError):
    """Checkpoint directory unusable or no checkpoint could be restored."""


class TrainingError(RuntimeError):
    """The run cannot continue (diverged, or inconsistent with its workdir)."""
