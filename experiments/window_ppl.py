"""Splits a finished run's held-out / train gap in two: memorisation and the held-out shift.

    python -m experiments.window_ppl --workdir=/tmp/cmp_small/gpn_m/s0 [--batches=46]

Scores the run's final parameters (as `windows_ppl`: every window from the zero state) on three
sets of `--batches` training-size batches:

  seen      training batches the run trained on, spread evenly over its steps;
  unseen    the training batches of the same epoch that come after its last step (never read);
  held-out  the first held-out batches.

seen < unseen is memorisation of windows read once or more; unseen vs held-out is how unlike the
held-out documents are to the training split (neither set was trained on). The training order is
the run's own (`WindowIterator.batch_at`: step s reads batch s), so this needs a run that stopped
before the end of its first epoch with `--batches` unseen batches left in it.
"""

import itertools
import json

from absl import flags

from gpn_jax.io import cli


def seen_and_unseen_steps(trained_steps: int, steps_per_epoch: int, batches: int) -> dict:
    """{'seen': `batches` steps spread over [0, trained_steps), 'unseen': the next `batches`}."""
    if not 0 < batches <= trained_steps:
        raise ValueError(
            f"--batches must be in [1, {trained_steps}] (the run trained {trained_steps} steps)"
        )
    if trained_steps + batches > steps_per_epoch:
        raise ValueError(
            f"the run trained {trained_steps} of the {steps_per_epoch} steps of its first epoch: "
            f"fewer than {batches} unseen batches are left (lower --batches)"
        )
    seen = [trained_steps * i // batches for i in range(batches)]
    return {"seen": seen, "unseen": list(range(trained_steps, trained_steps + batches))}


def window_ppl(workdir: str, batches: int) -> dict:
    """PPL of the run at `workdir` on its seen, unseen and held-out batches (module doc)."""
    from gpn_jax.checkpoints.restore import load_run
    from gpn_jax.eval.ppl import windows_ppl

    run = load_run(workdir)
    data = run.data()
    steps = seen_and_unseen_steps(int(run.step), data.train.steps_per_epoch, batches)
    sets = {name: [data.train.batch_at(s) for s in ss] for name, ss in steps.items()}
    sets["heldout"] = list(itertools.islice(data.heldout_windows(), batches))
    if len(sets["heldout"]) < batches:
        raise ValueError(
            f"the held-out split has {len(sets['heldout'])} batches, fewer than {batches}"
        )
    out = {"workdir": workdir, "step": int(run.step), "batches": batches}
    for name, windows in sets.items():
        res = windows_ppl(run.model, run.params, windows)
        out[f"{name}_ppl"], out[f"{name}_tokens"] = res["ppl"], res["tokens"]
    out["memorisation"] = out["unseen_ppl"] / out["seen_ppl"] - 1
    out["heldout_shift"] = out["heldout_ppl"] / out["unseen_ppl"] - 1
    return out


# allow_override: tests import several entry points into one process (as experiments.compare)
_WORKDIR = flags.DEFINE_string("workdir", None, "A finished training run.", allow_override=True)
_BATCHES = flags.DEFINE_integer(
    "batches", 46, "Batches per set (46 x 16 x 256 = 188k tokens).", allow_override=True
)
flags.mark_flags_as_required(["workdir"])


def _body():
    out = window_ppl(_WORKDIR.value, _BATCHES.value)
    print(json.dumps(out, indent=1))
    print(
        f"seen {out['seen_ppl']:.2f} / unseen {out['unseen_ppl']:.2f} / held-out "
        f"{out['heldout_ppl']:.2f}: memorisation {out['memorisation']:+.1%}, held-out shift "
        f"{out['heldout_shift']:+.1%}"
    )
    return out


main, run = cli.absl_entry(_body, "window-ppl")


if __name__ == "__main__":
    run()
