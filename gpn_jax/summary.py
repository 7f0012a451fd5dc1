"""Prints a config's parameter count (by group), forward/training FLOPs per token and, for
families with a byte model, training bytes per token and the roofline bound on accelerators
named by `--device_spec` (data-sheet numbers, `gpn_jax.benchmarks.roofline`).

python -m gpn_jax.summary --config=experiments/configs/gpn_m_1l_130m.py [--json] \\
    [--batch_size=16] [--device_spec=h100,h200,v5e,v5p]
"""

import json

from absl import flags
from ml_collections import config_flags

from gpn_jax.benchmarks import roofline
from gpn_jax.io import cli
from gpn_jax.models import factory

_CONFIG = config_flags.DEFINE_config_file("config", None, "ml_collections config file.")
_JSON = flags.DEFINE_bool("json", False, "Print machine-readable JSON instead of a table.")
_BATCH = flags.DEFINE_integer(
    "batch_size", 0, "Sequences per chip for the byte count (default: config.train.batch_size)."
)
_DEVICE_SPEC = flags.DEFINE_string(
    "device_spec", "", "Comma-separated accelerators (h100,h200,v5e,v5p): roofline bound."
)
flags.mark_flags_as_required(["config"])


def format_summary(s: dict) -> str:
    lines = [f"{'group':<16}{'parameters':>16}"]
    lines += [f"{g:<16}{n:>16,}" for g, n in s["params"]["groups"].items()]
    lines.append(f"{'total':<16}{s['params']['total']:>16,}")
    f = s["flops_per_token"]
    lines.append(
        f"FLOPs/token (T={s['seq_len']}): forward {f['forward']:,}  training {f['train']:,}"
    )
    if s.get("bytes_per_token"):
        terms = ", ".join(
            f"{k} {v / 2**20:.1f}" for k, v in s["bytes_per_token"].items() if k != "train"
        )
        lines.append(
            f"bytes/token (training, B={s['batch_size']} per chip): "
            f"{s['bytes_per_token']['train'] / 2**20:.1f} MiB ({terms})"
        )
    for name, r in s.get("roofline", {}).items():
        lines.append(
            f"  {name} (data sheet): <= {r['tokens_per_s']:,.0f} tokens/s, {r['bound_by']}-bound"
        )
    return "\n".join(lines)


def _body():
    config = cli.config_or_exit(_CONFIG, "gpn-summary")
    specs = roofline.parse_device_specs(_DEVICE_SPEC.value)
    from gpn_jax.models import accounting  # JAX: imported after the config and flag checks

    model = factory.build_model(config.model)
    T, B = config.train.seq_len, _BATCH.value or config.train.batch_size
    s = accounting.summary(model, T)
    byt = accounting.bytes_per_token(model, B, T)
    if byt:
        s |= {"batch_size": B, "bytes_per_token": byt, "roofline": {}}
        for d in specs:
            tps, by = roofline.bound(
                s["flops_per_token"]["train"], byt["train"], d.peak_flops, d.bandwidth
            )
            s["roofline"][d.name] = {"tokens_per_s": tps, "bound_by": by}
    print(json.dumps(s, indent=2) if _JSON.value else format_summary(s))


main, run = cli.absl_entry(_body, "gpn-summary", quiet=False)


if __name__ == "__main__":
    run()
