"""What a suite's cells show, as table rows computed from the cells alone: each cell against
its level without the ability (`levels`), the step its learning started, and the published
claims the suite can test beside what it measured. The result file stores these rows and the
docs render them, so no sentence about a result is written by hand."""

import numpy as np

from experiments.synthetic import levels

COLUMNS = ("gpn_m", "gpn", "transformer", "gdn", "gdn_neg")
LEARNT = " ✓"  # the cell clears its level by the margin its seeds support
SOLVED = 0.9  # a published "solves": accuracy at least this in every setting


def _mean_sd(accs) -> str:
    a = np.asarray(accs, float)
    return f"{a.mean():.3f} ± {a.std(ddof=1) if a.size > 1 else 0.0:.3f}"


def _cell(accs, learnt) -> str:
    return _mean_sd(accs) + (LEARNT if learnt else "")


def _chance(x: dict) -> str:
    return "–" if x["chance"] is None else f"{x['chance']:.3f}"


def _levels_text(cells: list[dict]) -> str:
    """The level, or the most common one and each family whose level differs."""
    values = [round(x["level"], 3) for x in cells]
    common = max(set(values), key=values.count)
    odd = [f"{x['model']} {v:.3f}" for x, v in zip(cells, values, strict=True) if v != common]
    return "; ".join([f"{common:.3f}", *odd])


def level_rows(cells: list[dict]) -> list[dict]:
    """Per task: test accuracy at the training length against its level; for state tasks a
    second row, the positions past the training length (level: chance)."""
    rows = []
    for task in dict.fromkeys(x["task"] for x in cells):
        mine = [x for x in cells if x["task"] == task]
        by = {x["family"]: x for x in mine}
        first = mine[0]
        T = first["settings_seq_len"]
        row = {"task": task, "measured": f"T = {T}", "chance": _chance(first),
               "level": _levels_text(mine)}  # fmt: skip
        row |= {f: _cell(by[f]["test_acc"], by[f]["learnt"]) if f in by else "–" for f in COLUMNS}
        rows.append(row)
        if first.get("beyond_acc"):
            L = max(int(k) for k in first["length_acc"])
            row = {"task": task, "measured": f"positions {T + 1}–{L} of T = {L}",
                   "chance": _chance(first), "level": _chance(first)}  # fmt: skip
            row |= {
                f: _cell(by[f]["beyond_acc"], by[f]["learnt_beyond"]) if f in by else "–"
                for f in COLUMNS
            }
            rows.append(row)
    return rows


def onset_rows(cells: list[dict], steps: int) -> list[dict]:
    """Per task: the first validation step at which each family's seeds cleared the level
    ("never" within `steps`)."""
    rows = []
    for task in dict.fromkeys(x["task"] for x in cells):
        by = {x["family"]: x for x in cells if x["task"] == task}
        row = {"task": task, "steps": steps}
        for f in COLUMNS:
            step = by[f].get("onset_step") if f in by else None
            row[f] = "–" if f not in by else ("never" if step is None else f"{step:,}")
        rows.append(row)
    return rows


def _find(cells, kind: str, family: str) -> list[dict]:
    return [x for x in cells if x.get("kind") == kind and x["family"] == family]


def _beyond(cells, kind: str, family: str, want: bool) -> tuple[str, str] | None:
    """Ours for a claim about `family` past the training length. A claim that the family does
    not learn it is "untested" when no family learnt the task even at the training length."""
    x = _find(cells, kind, family)
    if not x or not x[0].get("beyond_acc"):
        return None
    x = x[0]
    T, L = x["settings_seq_len"], max(int(k) for k in x["length_acc"])
    text = (f"{_mean_sd(x['test_acc'])} at T = {T}; {_mean_sd(x['beyond_acc'])} on positions "
            f"{T + 1}–{L} (chance {x['chance']:.3f})")  # fmt: skip
    if not want and not any(c["learnt"] for c in cells if c.get("kind") == kind):
        return text + f"; no family learnt {kind} even at T = {T}", "untested"
    return text, "yes" if x["learnt_beyond"] == want else "no"


def _solves(cells, kind: str, family: str, floor: float = SOLVED) -> tuple[str, str] | None:
    xs = _find(cells, kind, family)
    if not xs:
        return None
    parts = [
        f"{x['task']}: {_mean_sd(x['test_acc'])}, {sum(a >= floor for a in x['test_acc'])} of "
        f"{len(x['test_acc'])} seeds ≥ {floor} (level {x['level']:.3f})"
        for x in xs
    ]
    ok = all(x["learnt"] and np.mean(x["test_acc"]) >= floor for x in xs)
    return "; ".join(parts), "yes" if ok else "no"


# (source, their statement, the test on our cells, what "agrees" requires)
PUBLISHED = (
    ("Grazzi et al. 2024", "DeltaNet with β ∈ [0, 2] (eigenvalues in [−1, 1]) learns parity "
     "and extrapolates past its training lengths (trained on 3–40, tested to 256)",
     lambda c: _beyond(c, "parity", "gdn_neg", True), "learnt past the training length"),
    ("Grazzi et al. 2024", "with β ∈ [0, 1] (eigenvalues in [0, 1]) DeltaNet does not solve "
     "parity at finite precision",
     lambda c: _beyond(c, "parity", "gdn", False), "not learnt past the training length"),
    ("Arora et al. 2023 (Zoology)", "attention solves MQAR at every model width tested",
     lambda c: _solves(c, "mqar", "transformer"), "learnt, ≥ 0.9 in every MQAR row"),
    ("Yang et al. 2024 (DeltaNet)", "the delta rule makes a linear transformer recall "
     "associatively (MQAR) far better than additive linear attention and state-space models",
     lambda c: _solves(c, "mqar", "gdn"), "learnt, ≥ 0.9 in every MQAR row"),
    ("Merrill et al. 2024", "S5 state tracking is beyond transformers of fixed depth: they "
     "do not track it at lengths past what their depth allows",
     lambda c: _beyond(c, "s5", "transformer", False), "not learnt past the training length"),
)  # fmt: skip


def published_rows(cells: list[dict]) -> list[dict]:
    """One row per published claim whose cells the suite ran: theirs, ours, agreement."""
    rows = []
    for source, claim, test, rule in PUBLISHED:
        got = test(cells)
        if got is not None:
            ours, agrees = got
            rows.append({"source": source, "claim": claim, "ours": ours, "rule": rule,
                         "agrees": agrees})  # fmt: skip
    return rows


def judge(x: dict) -> dict:
    """The cell with its verdicts from its own accuracies (`levels`): learnt at the training
    length, learnt past it (state tasks), and the validation step where learning showed."""
    lr = list(x["valid_acc_by_lr"]).index(f"{x['best_lr']:g}")
    n = len(x["test_acc"])
    beyond = x.get("beyond_acc") or []
    return x | {
        "learnt": levels.learnt(x["test_acc"], x["level"]),
        "learnt_beyond": levels.learnt(beyond, x["chance"]) if beyond else None,
        "onset_step": levels.onset(
            x.get("valid_curve", []), slice(lr * n, (lr + 1) * n), x["level"]
        ),
    }


def annotate(c, cells: list[dict]) -> list[dict]:
    """The judged cells with the task settings the rows read (training length, generator)."""
    out = []
    for x in cells:
        t = c.tasks[x["task"]]
        out.append(judge(x) | {"settings_seq_len": t.seq_len,
                               "kind": x.get("kind") or t.get("kind") or x["task"]})  # fmt: skip
    return out


def has_levels(cells: list[dict]) -> bool:
    return bool(cells) and all("level" in x for x in cells)
