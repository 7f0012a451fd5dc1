"""Upper bounds of a model block's sizes, checked before anything is built or allocated: by
the trainer (`training.validate`) and by every reader of a run or model directory, whose
config.json may have been edited (`n_layers=10000000` would be traced layer by layer until
memory runs out). Pure functions over the config; one ValueError line naming the field."""

from gpn_jax.models import factory

INT32_MAX = 2**31 - 1
# The model may hold at most this many parameters (a lower estimate, `estimated_parameters`):
# 2^40 float32 parameters are 4 TiB, past any mesh this trainer targets.
MAX_PARAMETERS = 2**40
# Layers are traced and compiled one by one: past this, a model is a typo or hostile.
MAX_LAYERS = 4096


def _at_most(block: str, field: str, value, maximum: int, why: str = "int32") -> None:
    if isinstance(value, int) and not isinstance(value, bool) and value > maximum:
        raise ValueError(
            f"config.{block}.{field} must be at most {maximum} ({why}), got {value!r:.60}"
        )


_SIZE_FIELDS = ("vocab_size", "d_model", "d_emb", "d_ffn", "n_layers", "n_heads", "d_key",
                "d_value", "max_seq_len", "loss_chunk", "conv_size", "chunk_size",
                "remat_segment")  # fmt: skip


def estimated_parameters(model_cfg) -> int:
    """A lower estimate of the parameter count of any family (the vocabulary projection, the
    SwiGLU matrices of every layer, a d x d matrix in GPN and attention): never more than the
    model holds, so a config refused for it is truly too large."""
    m = dict(model_cfg)
    size = lambda name: m.get(name, 0) if isinstance(m.get(name, 0), int) else 0  # noqa: E731
    d, width = size("d_model"), min(size("d_emb") or size("d_model"), size("d_model"))
    params = size("vocab_size") * width + 3 * max(size("n_layers"), 1) * d * size("d_ffn")
    if factory.family_name(m) in ("gpn", "transformer"):
        params += d * d
    return params


def check_model_size(model_cfg) -> None:
    """Each model size field in int32, and `estimated_parameters` at most MAX_PARAMETERS:
    refused before any weight is allocated, naming the largest size field."""
    m = dict(model_cfg)
    for field in _SIZE_FIELDS:
        _at_most("model", field, m.get(field, 0), INT32_MAX)
    _at_most("model", "n_layers", m.get("n_layers", 0), MAX_LAYERS, "layers")
    params = estimated_parameters(model_cfg)
    if params > MAX_PARAMETERS:
        sizes = {f: m[f] for f in _SIZE_FIELDS if isinstance(m.get(f), int) and f != "n_layers"}
        largest = max(sizes, key=sizes.get)
        raise ValueError(
            f"config.model.{largest}={sizes[largest]} makes the model at least {params:.2e} "
            f"parameters ({4 * params / 2**40:,.0f} TiB in float32), over the limit of "
            f"{MAX_PARAMETERS:.2e}; lower config.model.{largest}"
        )
