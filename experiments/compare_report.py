"""The comparison's outputs (`experiments.compare`): the Table-1-shaped Markdown with its
budget, data and seeds lines, and the loss curves of every model's run."""

import json
import os

from experiments import compare_claims, compare_seeds
from experiments import harness_table as paper_table

COLUMNS = (
    "Model",
    "Params",
    "Layers",
    "State dim",
    "Memory cells / state size",
    "Held-out PPL",
    "Train PPL",
    "Held-out / train - 1",
    "Same, unigram",
    "LAMBADA acc",
    "LAMBADA PPL",
)


def loss_curve(run_dir: str) -> tuple[list, list, list, list]:
    """(steps, training loss, eval steps, held-out loss) from metrics.jsonl (last row per step
    wins: a resumed run rewrites the steps after its checkpoint)."""
    train, heldout = {}, {}
    path = os.path.join(run_dir, "metrics.jsonl")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill
                if "loss" in row:
                    train[row["step"]] = row["loss"]
                if "heldout_loss" in row:
                    heldout[row["step"]] = row["heldout_loss"]
    ts, hs = sorted(train), sorted(heldout)
    return ts, [train[s] for s in ts], hs, [heldout[s] for s in hs]


def plot_losses(rows: list[dict], budget: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tps = budget["tokens_per_step"]
    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for i, r in enumerate(rows):
        color = f"C{i}"
        steps, loss, hsteps, hloss = loss_curve(r["workdir"])
        ax.plot(steps, loss, color=color, lw=1.5, label=f"{r['label']} ({r['params']:,} params)")
        if hsteps:
            ax.plot(hsteps, hloss, "o", color=color, ms=4, mfc="none")
    ax.plot([], [], "o", color="gray", mfc="none", label="held-out loss (periodic eval)")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (nats / token)")
    top = ax.secondary_xaxis("top", functions=(lambda s: s * tps / 1e6, lambda t: t * 1e6 / tps))
    top.set_xlabel("tokens (millions)")
    fig.suptitle(
        f"{budget['steps']} steps × {budget['batch_size']} × {budget['seq_len']} tokens, "
        "same data and tokenizer",
        fontsize=10,
    )
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _fmt(v, spec: str) -> str:
    return "—" if v is None else format(v, spec)


def markdown_table(rows: list[dict]) -> str:
    lines = [
        "| " + " | ".join(COLUMNS) + " |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        cells = "—" if not r["memory_cells"] else f"{r['memory_cells']:,} ({r['state_formula']})"
        lines.append(
            "| "
            + " | ".join(
                [
                    r["label"],
                    f"{r['params']:,}",
                    str(r["layers"]),
                    f"{r['state_dim']:,}",
                    cells,
                    compare_seeds.pm(r["heldout_ppl"], r.get("heldout_ppl_std")),
                    compare_seeds.pm(r.get("train_ppl"), r.get("train_ppl_std")),
                    compare_seeds.pm(r.get("gap"), r.get("gap_std"), "+.1%"),
                    compare_seeds.pm(r.get("unigram_gap"), r.get("unigram_gap_std"), "+.1%"),
                    _fmt(r["lambada_acc"], ".3f"),
                    _fmt(r["lambada_ppl"], ".2f"),
                ]
            )
            + " |"
        )
    return "\n".join(lines)


def markdown(result: dict) -> str:
    b = result["budget"]
    parts = [
        "Shared budget: "
        f"{b['steps']:,} steps × {b['batch_size']} × {b['seq_len']} tokens = "
        f"{b['tokens']:,} training tokens per model; AdamW lr {b['learning_rate']:g} "
        f"(warm-up {b['warmup_steps']}, cosine to {b['min_lr_ratio']:g}×), wd "
        f"{b['weight_decay']:g}, clip {b['grad_clip']:g}.",
        f"Data: {result['data']['source']}; tokenizer {result['data']['tokenizer'] or 'none'}. "
        f"Held-out PPL over the same {result['heldout_tokens']:,} held-out tokens for every "
        f"model (unigram PPL {result['unigram_ppl']:.2f}).",
        _seeds_line(result),
        "",
        markdown_table(result["rows"]),
        "",
    ]
    parts += [*result.get("gap_warnings", []), ""] if result.get("gap_warnings") else []
    lam = result["lambada"]
    if lam["path"]:
        parts.append(
            f"LAMBADA: {lam['path']} (paper protocol: first-sub-word accuracy, PPL over the "
            "target sub-words)."
        )
    else:
        parts.append(f"LAMBADA: {lam['note']}")
    if "harness" in result:
        parts += ["", "lm-evaluation-harness (the Gated DeltaNet paper's table):", "",
                  paper_table.markdown(result["harness"])]  # fmt: skip
    if result.get("claims"):
        parts += ["", compare_claims.markdown(result["claims"])]
    return "\n".join(parts) + "\n"


def _seeds_line(result: dict) -> str:
    n = result.get("seeds", 1)
    spread = "mean ± sample std over" if n > 1 else "one run,"
    return (
        f"Seeds: {spread} {n} seed(s) per model (seed {result['data']['seed']} + k). Train PPL: "
        "final parameters on as many training tokens as held out; the gap (held-out / train "
        f"PPL - 1) must stay within ±{compare_seeds.GAP_LIMIT:.0%} "
        f"({'not met: see the warnings' if result.get('gap_warnings') else 'met'}); 'Same, "
        "unigram' is that ratio for the training split's unigram model on the same tokens (the "
        "part of the gap due to which documents are held out). LAMBADA and harness columns: the "
        "first seed's run."
    )
