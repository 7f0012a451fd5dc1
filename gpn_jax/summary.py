"""Prints a config's parameter count (by group) and forward/training FLOPs per token.

python -m gpn_jax.summary --config=experiments/configs/gpn_m_1l_130m.py [--json]
"""

import json

from absl import flags
from ml_collections import config_flags

from gpn_jax import cli
from gpn_jax.models import accounting, factory

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file.")
_JSON = flags.DEFINE_bool("json", False, "Print machine-readable JSON instead of a table.")
flags.mark_flags_as_required(["config"])


def format_summary(s: dict) -> str:
    lines = [f"{'group':<16}{'parameters':>16}"]
    lines += [f"{g:<16}{n:>16,}" for g, n in s["params"]["groups"].items()]
    lines.append(f"{'total':<16}{s['params']['total']:>16,}")
    f = s["flops_per_token"]
    lines.append(
        f"FLOPs/token (T={s['seq_len']}): forward {f['forward']:,}  training {f['train']:,}"
    )
    return "\n".join(lines)


def _body():
    config = cli.config_or_exit(_CONFIG, "gpn-summary")
    s = accounting.summary(factory.build_model(config.model), config.train.seq_len)
    print(json.dumps(s, indent=2) if _JSON.value else format_summary(s))


main, run = cli.absl_entry(_body, "gpn-summary", quiet=False)


if __name__ == "__main__":
    run()
