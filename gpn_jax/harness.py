"""lm-evaluation-harness on a gpn_jax run: lm-eval's own CLI with the "gpn_jax" model registered.

    python -m gpn_jax.harness --model_args workdir=/tmp/run[,step=N,batch_size=B] \\
        --tasks zero_shot [--include_path DIR --num_fewshot K --limit N
        --output_path OUT ...] [--out RESULT.json --label NAME]

Every flag but `--model` (which defaults to gpn_jax), `--out` and `--label` goes to lm-eval
unchanged, so they mean exactly what lm-eval documents. `--tasks zero_shot` stands for the
zero-shot set that papers on recurrent LMs at this scale report (`eval.harness_run.ZERO_SHOT`). `--out` also
writes the scores as a gpn_jax result file (one row per task and metric, the paper's column
names), which `tools/render_results.py --table=zero_shot` renders. Hugging Face downloads are
off (HF_DATASETS_OFFLINE=1, HF_HUB_OFFLINE=1) unless the environment sets them: gpn_jax never
calls the network; set HF_DATASETS_OFFLINE=0 for the run that caches the datasets. Why this
wrapper: lm-eval's stock CLI only knows the models registered by the time it parses the flags;
importing `gpn_jax.eval.harness_lm` first registers ours. Needs `pip install -e .[eval]`.
"""

import sys

from gpn_jax.eval import harness_run
from gpn_jax.io import cli

PROG = "gpn-harness"
USAGE = f"""usage: {PROG} --model_args workdir=RUN[,KEY=VALUE...] --tasks TASKS [lm-eval flags]
                   [--out RESULT.json] [--label NAME]

lm-evaluation-harness's own CLI with the model `gpn_jax` registered and chosen by default
(--model gpn_jax): it restores a gpn_jax run (GPN, GPN+M, Gated DeltaNet, Transformer++) and
scores lm-eval's requests with it. --model_args (comma-separated KEY=VALUE):
  workdir=DIR        the run's directory; its newest readable checkpoint is loaded (required)
  step=N             a checkpoint step instead of the newest
  batch_size=B       rows per forward pass (default 16; lm-eval's --batch_size also works)
  window=W           tokens per call for the recurrent families (default: training seq_len, <= 256)
  tokenizer=PATH     a SentencePiece model instead of the run's tokenizer.model
  max_gen_toks=N     default generation limit (256); seed=S  sampling seed for do_sample tasks
--tasks zero_shot    = {",".join(harness_run.ZERO_SHOT)}
--out FILE           also write the scores as a gpn_jax result file (tools/render_results.py
                     --table=zero_shot renders it); --label NAME names its row (default: the
                     workdir's name)
Datasets: read from the Hugging Face cache; downloads are off (HF_DATASETS_OFFLINE=1,
HF_HUB_OFFLINE=1) unless the environment sets those variables, e.g. HF_DATASETS_OFFLINE=0
HF_HUB_OFFLINE=0 for the one run that fills the cache. Local tasks: --include_path DIR of task
YAMLs (when every --tasks name is one of them, lm-eval's built-in tasks are not indexed). Every
other flag is lm-eval's, as its help below says.
"""


def run(argv: list[str] | None = None) -> None:
    """Console script / `python -m gpn_jax.harness`: bad input is a one-line error."""
    argv = sys.argv[1:] if argv is None else argv
    cli.run_or_exit(lambda a: harness_run.evaluate(a, USAGE, PROG), argv, prog=PROG)


if __name__ == "__main__":
    run()
