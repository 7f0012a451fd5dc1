"""The README.md model card of an exported model directory (`gpn_jax.export`).

Every fact in it is read from the run (config, checkpoint step, final_metrics.json), so a
card never claims a number the run did not produce.
"""

import json
import os

from gpn_jax.models import factory
from gpn_jax.models.accounting import param_counts

_MAX_METRICS_BYTES = 1 << 20
_PPL_FIELDS = {"heldout_ppl": float, "unigram_ppl": float, "heldout_tokens": int}


def _final_metrics(workdir: str) -> dict | None:
    """The run's final held-out metrics, or None if the file is absent, not a regular file
    (a directory, a FIFO), not JSON, or lacks them (a run without a held-out set)."""
    from gpn_jax.io.regular import read_regular_file

    path = os.path.join(workdir, "final_metrics.json")
    try:
        final = json.loads(read_regular_file(path, _MAX_METRICS_BYTES))
    except (OSError, ValueError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return None
    if not isinstance(final, dict) or not all(
        isinstance(final.get(k), t | int) and not isinstance(final.get(k), bool)
        for k, t in _PPL_FIELDS.items()
    ):
        return None
    return final


def _architecture(config, model) -> list[str]:
    family = factory.family_name(config.model)
    v = factory.variant(config.model)
    name = v.title if v.label == v.title else f"{v.label}, {v.title}"
    counts = param_counts(model)
    lines = [f"- family: `{family}` ({name})", f"- parameters: {counts['total']:,}"]
    lines += [f"  - `{group}`: {n:,}" for group, n in sorted(counts["groups"].items())]
    fields = ", ".join(f"{k}={v}" for k, v in sorted(config.model.items()) if k != "family")
    return lines + [f"- model config: {fields}"]


def _training(config, record: dict, final: dict | None) -> list[str]:
    d, t = config.data, config.train
    lines = [
        f"- data source: `{d.source}` (held-out fraction {d.heldout_fraction}, seed {config.seed})",
        f"- tokenizer: {record['tokenizer_file'] or 'none (token ids)'}"
        + (f", sha256 `{record['tokenizer_sha256']}`" if record["tokenizer_sha256"] else ""),
        f"- steps: {record['step']:,} of {t.steps:,} (batch {t.batch_size} x {t.seq_len} tokens)",
        f"- tokens seen: {record['tokens_seen']:,}",
    ]
    if final is None:
        lines.append("- held-out PPL: not recorded (the run has no final_metrics.json)")
    else:
        note = "" if final.get("step") == record["step"] else f" (at step {final.get('step')})"
        lines.append(
            f"- held-out PPL: {final['heldout_ppl']:.3f}{note} vs unigram PPL "
            f"{final['unigram_ppl']:.3f}, over {final['heldout_tokens']:,} held-out tokens"
        )
    return lines


def model_card(run, record: dict, command: str) -> str:
    """Markdown for README.md of the directory `record` (config.json) describes."""
    final = _final_metrics(run.workdir)
    lines = [
        f"# gpn_jax {record['family']} model (step {record['step']:,})",
        "",
        f"Exported by gpn_jax {record['gpn_jax_version']} from a training run.",
        "",
        "## Architecture",
        *_architecture(run.config, run.model),
        "",
        "## Training",
        *_training(run.config, record, final),
        "",
        "## Use",
        "```python",
        "import gpn_jax",
        "",
        "lm = gpn_jax.load('.')  # config, model, params, tokenizer",
        "print(lm.generate('The', max_new_tokens=32, temperature=0.8))",
        "```",
        "or `gpn-generate --model_dir=. --prompt=...`, `gpn-evaluate --model_dir=. --eval=ppl`.",
        "",
        "## Made with",
        "```",
        command,
        "```",
        "",
    ]
    return "\n".join(lines)
