"""python -m experiments.synthetic --config=experiments/configs/synthetic_small.py --workdir=DIR

Trains and scores every (task, family) cell of the config (see `experiments.synthetic`),
printing progress; finished cells are kept in DIR and skipped by a rerun. Writes
DIR/<name>.json (the result file `tools/render_results.py` renders), DIR/<name>.md,
DIR/<name>_length.png (state tracking: accuracy vs test length) and DIR/<name>_bench.json
(wall time per cell).
"""

import time

from absl import flags
from ml_collections import config_flags

from experiments.synthetic import report, suite
from gpn_jax.io import cli

_CONFIG = config_flags.DEFINE_config_file("config", None, "experiments/configs/synthetic_*.py")
_WORKDIR = flags.DEFINE_string("workdir", None, "Suite directory (one JSON file per cell).")


def _body():
    if _CONFIG.value is None or not _WORKDIR.value:
        raise ValueError("--config and --workdir are required")
    c, workdir = _CONFIG.value, _WORKDIR.value
    start = time.time()
    cells = suite.run_suite(c, workdir, log=lambda s: print(s, flush=True))
    out = report.write_all(c, workdir, cells, time.time() - start)
    print(report.table_md(out["rows"]), end="")
    print(f"wrote {workdir}/{c.name}.json ({out['wall_s']} s)")


main, run = cli.absl_entry(_body, "experiments.synthetic")

if __name__ == "__main__":
    run()
