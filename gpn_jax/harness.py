"""lm-evaluation-harness on a gpn_jax run: lm-eval's own CLI with the "gpn_jax" model registered.

    python -m gpn_jax.harness --model_args workdir=/tmp/run[,step=N,batch_size=B] \\
        --tasks lambada_openai,piqa [--include_path DIR --num_fewshot K --limit N
        --output_path OUT ...]

Every flag but `--model` (which defaults to gpn_jax) goes to lm-eval unchanged, so they mean
exactly what lm-eval documents. Why this wrapper: lm-eval's stock CLI only knows the models
registered by the time it parses the flags, and it does not import other packages' models;
importing `gpn_jax.eval.harness_lm` first registers ours. Needs `pip install -e .[eval]`.
"""

import sys

from gpn_jax.io import cli

PROG = "gpn-harness"


def harness_argv(argv: list[str]) -> list[str]:
    """`argv` (flags only) with `--model gpn_jax` added unless a model is named."""
    named = any(a in ("--model", "-M") or a.startswith("--model=") for a in argv)
    return list(argv) if named else ["--model", "gpn_jax", *argv]


def flag_values(argv: list[str], *names: str) -> list[str]:
    """The value(s) of the first of `names` in `argv`: `--name=value`, or every word after
    `--name` up to the next flag (lm-eval's --model_args takes `k=v,k2=v2` or `k=v k2=v2`)."""
    for i, a in enumerate(argv):
        for name in names:
            if a.startswith(name + "="):
                return [a.split("=", 1)[1]]
            if a == name:
                words = []
                for w in argv[i + 1 :]:
                    if w.startswith("-"):
                        break
                    words.append(w)
                return words
    return []


def _cli_evaluate(argv: list[str]) -> None:
    try:
        from lm_eval.__main__ import cli_evaluate
        from lm_eval.utils import simple_parse_args_string

        from gpn_jax.eval import harness_lm  # registers the "gpn_jax" model
    except ImportError as e:
        raise ValueError(f"lm-eval is not installed ({e}); pip install -e '.[eval]'") from None
    args = harness_argv(argv)
    model_args = ",".join(flag_values(args, "--model_args", "-a"))
    if flag_values(args, "--model", "-M")[:1] == ["gpn_jax"] and model_args:
        # before lm-eval's CLI, which indexes every task file (~12 s) before building the model
        harness_lm.check_model_args(simple_parse_args_string(model_args))
    saved = sys.argv
    sys.argv = [PROG, *args]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved


def run(argv: list[str] | None = None) -> None:
    """Console script / `python -m gpn_jax.harness`: bad input is a one-line error."""
    cli.run_or_exit(_cli_evaluate, sys.argv[1:] if argv is None else argv, prog=PROG)


if __name__ == "__main__":
    run()
