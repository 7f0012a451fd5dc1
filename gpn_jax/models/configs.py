"""The model families' frozen config dataclasses, importable without JAX.

Loading an experiment config builds one of these (`gpn_jax.configs.recipe.model_block`), so a
bad config is reported before JAX, Flax or the training stack is imported. The model modules
(`gpn`, `gdn`, `transformer`) re-export their own config; the math lives there.

Each field declares its own rules as dataclass metadata (`size`, `switch`): its minimum (what
`training.validate` enforces), whether it is math-free (it changes how the result is computed,
never the result or the parameters, so it may change when a run resumes: `training.loop`'s
"same model?" check ignores it), and how `--config=...:cpu` shrinks it (`configs.recipe`).
"""

import dataclasses
import enum

from gpn_jax.core.kernel_ops import check_choice

# The matmul dtypes a model computes in (`compute_dtype`); state, norms and softmax stay float32.
COMPUTE_DTYPES = ("float32", "bfloat16", "float16", "float64")


def check_dtype(name: str) -> None:
    """A one-line ValueError unless `name` is one of COMPUTE_DTYPES."""
    if name not in COMPUTE_DTYPES:
        raise ValueError(f"compute_dtype must be one of {', '.join(COMPUTE_DTYPES)}, got {name!r}")


# ----------------------------------------------------------------------------- field rules
MINIMUM, MATH_FREE, CPU = "minimum", "math_free", "cpu"  # the metadata keys


def size(default=dataclasses.MISSING, *, minimum: int = 1, cpu=None):
    """An integer size field: its `minimum` and its `:cpu` shrink (`cpu(value) -> value`)."""
    return dataclasses.field(default=default, metadata={MINIMUM: minimum, CPU: cpu})


def switch(default, *, minimum: int | None = None, cpu=None):
    """A math-free field (a switch of how the math runs: chunking, remat, dtypes, kernels)."""
    return dataclasses.field(
        default=default, metadata={MATH_FREE: True, MINIMUM: minimum, CPU: cpu}
    )


def at_most(n: int):
    """`:cpu` rule: the value capped at `n`."""
    return lambda v: min(v, n)


def becomes(x):
    """`:cpu` rule: the value replaced by `x`."""
    return lambda v: x


def if_set(x):
    """`:cpu` rule: a set (non-zero) value replaced by `x`; 0 (off) stays 0."""
    return lambda v: x if v else v


def family_configs() -> tuple[type, ...]:
    """Every family's config dataclass (defined below)."""
    return GPNConfig, GDNConfig, TransformerConfig


def field_rule(key: str, cls: type | None = None) -> dict:
    """{field name: its rule `key` (MINIMUM or CPU)} of the fields of `cls` (None: of every
    family; a name shared by families has the same rule in each) that set it."""
    return {
        f.name: f.metadata[key]
        for c in (family_configs() if cls is None else (cls,))
        for f in dataclasses.fields(c)
        if f.metadata.get(key) is not None
    }


def math_free_fields() -> frozenset:
    """The model fields that never change the result or the parameters (`switch`)."""
    return frozenset(
        f.name
        for cls in family_configs()
        for f in dataclasses.fields(cls)
        if f.metadata.get(MATH_FREE)
    )


class ScanImpl(enum.StrEnum):
    """How the window is scanned and differentiated (same math; configs give the string).

    FUSED (the default): `core.fused.window` (fused projections, custom VJP with weight
    gradients out of the loop, cross-entropy gradients in the forward pass), tensor parallelism
    over whole memory heads and d_ffn slices; no interventions, and no tensor size that does
    not divide n_heads and d_ffn (both refused with an error naming AUTODIFF). AUTODIFF: the
    reference, `lax.scan` over `gpn.step` differentiated by JAX (`core.autodiff_window`), any
    intervention, any mesh; the tests compare FUSED against it."""

    AUTODIFF = "autodiff"
    FUSED = "fused"


@dataclasses.dataclass(frozen=True)
class GPNConfig:
    """Sizes and training-scale switches of a GPN / GPN+M model (switches never change the math)."""

    vocab_size: int = size(cpu=becomes(2048))
    d_model: int = size(cpu=at_most(128))  # state width d
    d_emb: int = size(cpu=at_most(64))
    d_ffn: int = size(cpu=at_most(256))
    # memory heads H (0 with memory=False, where the three may be 0: `training.validate`)
    n_heads: int = size(0, cpu=at_most(2))
    d_key: int = size(0, cpu=at_most(16))
    d_value: int = size(0, cpu=at_most(32))
    n_layers: int = size(1, cpu=at_most(2))  # predict layers L per token
    memory: bool = True  # False: GPN (no matrix memory)
    decoder_bias: bool = False
    # matmul dtype; state, memory, norms and softmax stay float32
    compute_dtype: str = switch("float32", cpu=becomes("float32"))
    # storage dtype of the matrix memory between tokens ("float32" | "bfloat16"); its updates
    # and reads compute in float32. bfloat16 halves the memory's per-token traffic (accelerators)
    memory_dtype: str = switch("float32")
    # >0: rematerialise the scan in segments of this many tokens
    remat_segment: int = switch(0, minimum=0, cpu=if_set(32))
    # with remat_segment: keep each step's memory reads (n_layers x H x U float32 per token and
    # sequence) so that the backward reruns a segment's products at once, not token by token
    # (scan_impl "fused", tensor size 1)
    remat_parallel: bool = switch(False)
    # tokens per iteration of the fused window's per-token loops (lax.scan's unroll): on a GPU
    # XLA fuses the independent small operations of consecutive tokens, so fewer kernels launch
    scan_unroll: int = switch(1, minimum=1)
    loss_chunk: int = switch(128, minimum=1)  # time steps decoded at once after the scan
    scan_impl: ScanImpl = switch(ScanImpl.FUSED)  # "fused" | "autodiff" (`ScanImpl`; same math)
    # the fused window's memory passes and products: "auto" | "xla" | "native" | "pallas"
    # (`gpn_jax.kernels.resolve`; same math)
    kernels: str = switch("auto")

    def __post_init__(self):
        if self.memory and min(self.n_heads, self.d_key, self.d_value) <= 0:
            raise ValueError("GPN+M needs n_heads, d_key and d_value > 0")
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")
        check_dtype(self.compute_dtype)
        if self.remat_parallel and not self.remat_segment:
            raise ValueError(
                "remat_parallel changes how remat segments rerun: set remat_segment > 0 too "
                "(e.g. --config.model.remat_segment=64)"
            )
        if self.remat_parallel and self.scan_impl != ScanImpl.FUSED:
            raise ValueError(
                "remat_parallel reruns the fused window's segments: use scan_impl='fused' "
                "or --config.model.remat_parallel=False"
            )
        if self.memory_dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"memory_dtype must be 'float32' or 'bfloat16', got {self.memory_dtype!r}"
            )
        if self.scan_impl not in tuple(ScanImpl):
            raise ValueError(f"scan_impl must be 'autodiff' or 'fused', got {self.scan_impl!r}")
        object.__setattr__(self, "scan_impl", ScanImpl(self.scan_impl))
        check_choice(self.kernels)

    @property
    def memory_cells(self) -> int:
        """H x K x U: the matrix memory's cells (0 for GPN)."""
        return self.n_heads * self.d_key * self.d_value if self.memory else 0

    def state(self, seq_len: int) -> tuple[int, str, str]:
        """(cells, kind, formula) of what the model carries from token to token."""
        if not self.memory:
            return 0, "none", "no memory"
        shape = f"{self.n_heads}×{self.d_key}×{self.d_value}"
        return self.memory_cells, "matrix memory", f"{shape} memory"


@dataclasses.dataclass(frozen=True)
class GDNConfig:
    """Sizes and training-scale switches of a Gated DeltaNet (switches never change the math)."""

    vocab_size: int = size(cpu=becomes(2048))
    d_model: int = size(cpu=at_most(128))
    n_layers: int = size(cpu=at_most(2))
    n_heads: int = size(cpu=at_most(2))
    d_key: int = size(cpu=at_most(16))  # head width of q and k
    d_value: int = size(cpu=at_most(32))  # head width of v (and of the output gate)
    d_ffn: int = size(cpu=at_most(256))  # SwiGLU hidden width (W1, W3 are (d, d_ffn))
    conv_size: int = size(4)  # depthwise causal short-convolution kernel on q, k, v
    tie_embeddings: bool = True
    bos_id: int = size(1, minimum=0)
    # matmul dtype; residual, norms, conv, delta rule stay float32
    compute_dtype: str = switch("float32", cpu=becomes("float32"))
    chunk_size: int = size(64, minimum=0)  # chunk length of the chunked delta rule; 0: recurrent
    loss_chunk: int = switch(128, minimum=1)  # positions decoded to logits at once in the loss
    remat: bool = switch(False)  # rematerialise each block in the backward pass
    # beta = 2 sigmoid(.) in [0, 2]: the state transition I - beta k k^T may then have a
    # negative eigenvalue (Grazzi et al. 2024), which lets one layer track parity; False: [0, 1]
    negative_eigenvalues: bool = False

    def __post_init__(self):
        if min(self.n_heads, self.d_key, self.d_value, self.d_ffn, self.d_model) <= 0:
            raise ValueError("d_model, n_heads, d_key, d_value and d_ffn must be > 0")
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")
        if self.conv_size < 1:
            raise ValueError(f"conv_size must be >= 1, got {self.conv_size}")
        if self.chunk_size < 0:
            raise ValueError(f"chunk_size must be >= 0, got {self.chunk_size}")
        if not 0 <= self.bos_id < self.vocab_size:
            raise ValueError(f"bos_id {self.bos_id} outside the vocabulary")
        check_dtype(self.compute_dtype)

    @property
    def d_qk(self) -> int:
        return self.n_heads * self.d_key

    @property
    def d_v(self) -> int:
        return self.n_heads * self.d_value

    @property
    def d_conv(self) -> int:
        """Channels of the short convolution: [q | k | v]."""
        return 2 * self.d_qk + self.d_v

    def state(self, seq_len: int) -> tuple[int, str, str]:
        """(cells, kind, formula) of what the model carries from token to token."""
        shape = f"{self.n_layers}×{self.n_heads}×{self.d_key}×{self.d_value}"
        return self.n_layers * self.d_qk * self.d_value, "recurrent state", f"{shape} state"

    @property
    def direct_positions(self) -> int:
        """Leading positions whose whole prefix the model reads without its recurrent state:
        the stacked short convolutions see 1 + n_layers (conv_size - 1) tokens."""
        return 1 + self.n_layers * (self.conv_size - 1)


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and training-scale switches of a Transformer++ (switches never change the math)."""

    vocab_size: int = size(cpu=becomes(2048))
    d_model: int = size(cpu=at_most(128))
    n_layers: int = size(cpu=at_most(2))
    n_heads: int = size(cpu=at_most(2))
    d_ffn: int = size(cpu=at_most(256))  # SwiGLU hidden width (W1, W3 are (d, d_ffn))
    # training window; also the KV-cache length when decoding
    max_seq_len: int = size(cpu=becomes(128))
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    bos_id: int = size(1, minimum=0)
    # matmul / attention dtype; residual, norms, RoPE stay float32
    compute_dtype: str = switch("float32", cpu=becomes("float32"))
    loss_chunk: int = switch(128, minimum=1)  # positions decoded to logits at once in the loss
    remat: bool = switch(False)  # rematerialise each block in the backward pass
    # the training window's attention: "auto" (cuDNN's fused kernel on a GPU with a 16-bit
    # compute dtype, else XLA's) | "xla" | "cudnn" (`transformer.attention_impl`; same math)
    attention: str = switch("auto")

    def __post_init__(self):
        if self.attention not in ("auto", "xla", "cudnn"):
            raise ValueError(f"attention must be 'auto', 'xla' or 'cudnn', got {self.attention!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if (self.d_model // self.n_heads) % 2:
            raise ValueError("RoPE needs an even head dimension")
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")
        if not 0 <= self.bos_id < self.vocab_size:
            raise ValueError(f"bos_id {self.bos_id} outside the vocabulary")
        check_dtype(self.compute_dtype)

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def state(self, seq_len: int) -> tuple[int, str, str]:
        """(cells, kind, formula) of what the model carries from token to token."""
        cells = 2 * self.n_layers * seq_len * self.d_model
        return cells, "KV cache", f"KV cache 2×{self.n_layers}×{seq_len}×{self.d_model}"
