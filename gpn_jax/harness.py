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

from gpn_jax import cli

PROG = "gpn-harness"


def harness_argv(argv: list[str]) -> list[str]:
    """`argv` (flags only) with `--model gpn_jax` added unless a model is named."""
    named = any(a in ("--model", "-M") or a.startswith("--model=") for a in argv)
    return list(argv) if named else ["--model", "gpn_jax", *argv]


def _cli_evaluate(argv: list[str]) -> None:
    try:
        from lm_eval.__main__ import cli_evaluate

        import gpn_jax.eval.harness_lm  # noqa: F401  (registers the "gpn_jax" model)
    except ImportError as e:
        raise ValueError(f"lm-eval is not installed ({e}); pip install -e '.[eval]'") from None
    saved = sys.argv
    sys.argv = [PROG, *harness_argv(argv)]
    try:
        cli_evaluate()
    finally:
        sys.argv = saved


def run(argv: list[str] | None = None) -> None:
    """Console script / `python -m gpn_jax.harness`: bad input is a one-line error."""
    cli.run_or_exit(_cli_evaluate, sys.argv[1:] if argv is None else argv, prog=PROG)


if __name__ == "__main__":
    run()
