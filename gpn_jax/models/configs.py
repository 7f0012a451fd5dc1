"""The model families' frozen config dataclasses, importable without JAX.

Loading an experiment config builds one of these (`gpn_jax.configs.common.model_block`), so a
bad config is reported before JAX, Flax or the training stack is imported. The model modules
(`gpn`, `gdn`, `transformer`) re-export their own config; the math lives there.
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


class ScanImpl(enum.StrEnum):
    """How the window is scanned and differentiated (same math; configs give the string).

    FUSED (the default): `core.fast_window` (fused projections, custom VJP with weight
    gradients out of the loop, cross-entropy gradients in the forward pass), tensor parallelism
    over whole memory heads and d_ffn slices; no interventions, and no tensor size that does
    not divide n_heads and d_ffn (both refused with an error naming AUTODIFF). AUTODIFF: the
    reference, `lax.scan` over `gpn.step` differentiated by JAX (`core.window`), any
    intervention, any mesh; the tests compare FUSED against it."""

    AUTODIFF = "autodiff"
    FUSED = "fused"


@dataclasses.dataclass(frozen=True)
class GPNConfig:
    """Sizes and training-scale switches of a GPN / GPN+M model (switches never change the math)."""

    vocab_size: int
    d_model: int  # state width d
    d_emb: int
    d_ffn: int
    n_heads: int = 0  # memory heads H (0 with memory=False)
    d_key: int = 0
    d_value: int = 0
    n_layers: int = 1  # predict layers L per token
    memory: bool = True  # False: GPN (no matrix memory)
    decoder_bias: bool = False
    compute_dtype: str = "float32"  # matmul dtype; state, memory, norms and softmax stay float32
    # storage dtype of the matrix memory between tokens ("float32" | "bfloat16"); its updates
    # and reads compute in float32. bfloat16 halves the memory's per-token traffic (accelerators)
    memory_dtype: str = "float32"
    remat_segment: int = 0  # >0: rematerialise the scan in segments of this many tokens
    loss_chunk: int = 128  # time steps decoded at once after the scan
    scan_impl: ScanImpl = ScanImpl.FUSED  # "fused" | "autodiff" (`ScanImpl`; same math)
    # the fused window's memory passes and products: "auto" | "xla" | "native" | "pallas"
    # (`gpn_jax.kernels.resolve`; same math)
    kernels: str = "auto"

    def __post_init__(self):
        if self.memory and min(self.n_heads, self.d_key, self.d_value) <= 0:
            raise ValueError("GPN+M needs n_heads, d_key and d_value > 0")
        if self.n_layers < 1:
            raise ValueError(f"n_layers must be >= 1, got {self.n_layers}")
        check_dtype(self.compute_dtype)
        if self.memory_dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"memory_dtype must be 'float32' or 'bfloat16', got {self.memory_dtype!r}"
            )
        if self.scan_impl not in tuple(ScanImpl):
            raise ValueError(f"scan_impl must be 'autodiff' or 'fused', got {self.scan_impl!r}")
        object.__setattr__(self, "scan_impl", ScanImpl(self.scan_impl))
        check_choice(self.kernels)


@dataclasses.dataclass(frozen=True)
class GDNConfig:
    """Sizes and training-scale switches of a Gated DeltaNet (switches never change the math)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_key: int  # head width of q and k
    d_value: int  # head width of v (and of the output gate)
    d_ffn: int  # SwiGLU hidden width (W1, W3 are (d, d_ffn))
    conv_size: int = 4  # depthwise causal short-convolution kernel on q, k, v
    tie_embeddings: bool = True
    bos_id: int = 1
    compute_dtype: str = "float32"  # matmul dtype; residual, norms, conv, delta rule stay float32
    chunk_size: int = 64  # chunk length of the chunked delta rule; 0: recurrent form
    loss_chunk: int = 128  # positions decoded to logits at once in the loss
    remat: bool = False  # rematerialise each block in the backward pass
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


@dataclasses.dataclass(frozen=True)
class TransformerConfig:
    """Sizes and training-scale switches of a Transformer++ (switches never change the math)."""

    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    d_ffn: int  # SwiGLU hidden width (W1, W3 are (d, d_ffn))
    max_seq_len: int  # training window; also the KV-cache length when decoding
    rope_theta: float = 10000.0
    tie_embeddings: bool = True
    bos_id: int = 1
    compute_dtype: str = "float32"  # matmul / attention dtype; residual, norms, RoPE stay float32
    loss_chunk: int = 128  # positions decoded to logits at once in the loss
    remat: bool = False  # rematerialise each block in the backward pass

    def __post_init__(self):
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
