"""Exports a trained run as a shareable model directory; `load(dir)` reads one back.

    python -m gpn_jax.export --workdir=/tmp/run --out=/tmp/run_export [--step=N]

writes model.safetensors, config.json, tokenizer.model and a README.md model card (layout:
`gpn_jax.checkpoints.model_dir`). `load(dir)` returns what `gpn_jax.checkpoints.restore.load_run`
returns for a workdir, without orbax or the workdir; `gpn-generate` / `gpn-evaluate` take
`--model_dir=dir`. Publishing is the user's `hf upload <repo> <dir>`.

The flags are declared when the command runs, not on import, so library code (and other
entry points, which declare their own --workdir) can `from gpn_jax.export import load`.
"""

import shlex
import sys

from gpn_jax.io import cli

_FLAGS: dict = {}


def load(model_dir: str):
    """The `RestoredRun` (config, model, params, tokenizer, step, workdir=model_dir) of `model_dir`.

    Raises:
      ValueError: not a model directory, tensors that disagree with config.json (the first
        mismatch is named), or a tokenizer whose sha256 is not the recorded one.
    """
    from gpn_jax.checkpoints.model_dir import load_model_dir  # JAX: not loaded for a flag error

    return load_model_dir(model_dir)


def export(
    workdir: str, out: str, step: int | None = None, command: str = "", overwrite: bool = False
) -> dict:
    """Writes the (given or newest readable) checkpoint of `workdir` to `out`; returns config.json.

    `out` is written whole into a temporary sibling and moved into place. It must be new,
    empty or an earlier export of the same run; an earlier export of another run, or a
    folder the export did not create, only with `overwrite`. Either way only the files an
    export wrote there (its marker, `checkpoints.owned_dir`) are replaced: a user's files
    are never deleted or overwritten. Never the run's workdir, a directory inside it or one
    holding it.
    """
    from gpn_jax.checkpoints import model_card, model_dir
    from gpn_jax.checkpoints.restore import load_run

    if not out:
        raise ValueError("--out is required")
    _check_out(workdir, out, overwrite)  # before any work
    run = load_run(workdir, step)
    record = model_dir.make_record(run)
    card = model_card.model_card(run, record, command or f"gpn-export --workdir={workdir}")
    return model_dir.save_model_dir_atomic(run, out, record, card)


def _check_out(workdir: str, out: str, overwrite: bool) -> None:
    """A one-line ValueError if the export may not write into `out`."""
    import os

    from gpn_jax.checkpoints import model_dir

    run, dst = os.path.realpath(workdir), os.path.realpath(out)
    if os.path.commonpath([run, dst]) in (run, dst):
        raise ValueError(
            f"--out={out} is the run's workdir {workdir}, inside it or holding it; "
            "give a directory outside the run"
        )
    if not os.path.lexists(out):
        return
    if not os.path.isdir(out) or os.path.islink(out):
        raise ValueError(f"--out={out} exists and is not a directory; give a new directory")
    if not os.listdir(out) or overwrite or model_dir.exported_from(out) == run:
        return
    raise ValueError(
        f"--out={out} is a non-empty directory that is not an earlier export of this run; "
        "give a new directory, or --overwrite to replace it"
    )


def _define_flags() -> None:
    from absl import flags

    if _FLAGS:
        return
    _FLAGS["workdir"] = flags.DEFINE_string("workdir", None, "Run directory to export.")
    _FLAGS["out"] = flags.DEFINE_string("out", None, "Directory to write the model to.")
    _FLAGS["step"] = flags.DEFINE_integer("step", None, "Checkpoint step (default: newest).")
    _FLAGS["overwrite"] = flags.DEFINE_bool(
        "overwrite",
        False,
        "Write into a non-empty --out that is not an export of this run (replacing only "
        "files an export wrote there, never a user's).",
    )
    flags.mark_flags_as_required(["workdir", "out"])


def _body():
    command = " ".join(["python -m gpn_jax.export", *map(shlex.quote, sys.argv[1:])])
    workdir, out = _FLAGS["workdir"].value, _FLAGS["out"].value
    from gpn_jax.checkpoints import model_card, model_dir, restore  # noqa: F401 (what export uses)

    cli.settle_heap()  # the imported stack out of the garbage collector's passes
    record = export(workdir, out, _FLAGS["step"].value, command, _FLAGS["overwrite"].value)
    print(f"exported step {record['step']} of {workdir} to {out}")


_run = cli.absl_entry(_body, "gpn-export")[1]


def run():
    _define_flags()
    _run()


if __name__ == "__main__":
    run()
