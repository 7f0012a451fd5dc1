"""The compared families' model blocks, sized to GPN+M's parameter count.

GPN+M sets the budget at `width` (d_emb width/2, d_ffn `ffn_mult` x width, `heads` memory
heads of width/(2 heads) x width/heads); every other family gets the d_ffn (a multiple of 8)
whose count is nearest it, as `experiments.recall_sweep` matches MQAR's families.
"""

from gpn_jax.models import accounting, factory

NAMES = {
    "gpn_m": "GPN+M",
    "gpn": "GPN",
    "transformer": "Transformer++",
    "gdn": "Gated DeltaNet",
    "gdn_neg": "Gated DeltaNet, β ∈ [0, 2]",
}


def base_fields(family: str, c, vocab: int, max_len: int) -> dict:
    """The family's model block before matching (`c`: the suite config)."""
    w, h = c.width, c.heads
    ffn = max(8, round(c.ffn_mult * w / 8) * 8)
    gpn_m = dict(family="gpn", vocab_size=vocab, d_model=w, d_emb=w // 2, d_ffn=ffn,
                 n_heads=h, d_key=max(w // (2 * h), 1), d_value=max(w // h, 1),
                 loss_chunk=64)  # fmt: skip
    gdn = dict(family="gdn", vocab_size=vocab, d_model=w, n_layers=c.gdn_layers, n_heads=2,
               d_key=max(w // 4, 1), d_value=max(w // 2, 1), d_ffn=2 * w,
               chunk_size=c.gdn_chunk, loss_chunk=64)  # fmt: skip
    table = {
        "gpn_m": gpn_m,
        "gpn": gpn_m | dict(memory=False, n_heads=0, d_key=0, d_value=0),
        "gdn": gdn,
        "gdn_neg": gdn | dict(negative_eigenvalues=True),
        "transformer": dict(
            family="transformer",
            vocab_size=vocab,
            d_model=w,
            n_layers=c.transformer_layers,
            n_heads=2,
            d_ffn=2 * w,
            max_seq_len=max_len,
            loss_chunk=64,
        ),  # fmt: skip
    }
    if family not in table:
        raise ValueError(f"unknown family {family!r}; choose from {','.join(NAMES)}")
    return table[family]


def n_params(fields: dict) -> int:
    return accounting.param_counts(factory.build_model(fields))["total"]


def match_ffn(fields: dict, target: int) -> dict:
    """`fields` with the d_ffn (multiple of 8) whose count is nearest `target` (linear in d_ffn)."""
    a, b = n_params(fields | dict(d_ffn=8)), n_params(fields | dict(d_ffn=16))
    per = (b - a) / 8
    return fields | dict(d_ffn=int(max(8, round((8 + (target - a) / per) / 8) * 8)))


def model_fields(family: str, c, vocab: int, max_len: int) -> dict:
    """The family's block at GPN+M's parameter count."""
    fields = base_fields(family, c, vocab, max_len)
    if family == "gpn_m":
        return fields
    return match_ffn(fields, n_params(base_fields("gpn_m", c, vocab, max_len)))


def family_list(text: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in NAMES]
    if unknown or not names:
        raise ValueError(f"unknown families {unknown or names}; choose from {','.join(NAMES)}")
    return names
