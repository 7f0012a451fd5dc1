"""GPN and GPN+M: parameter specs (initialiser, shape, logical axes) plus the model's pure
entry points.

Why linen (`gpn_jax.models.params`): a linen module's `init` returns a plain nested dict of
arrays, which is exactly what the pure `core` functions, orbax, optax masks and the sharding
code consume; NNX would need a split/merge round trip at every boundary for no gain, since
the module only declares and initialises parameters and never runs the math.
"""

import dataclasses
from collections.abc import Mapping

import jax
import jax.numpy as jnp

from gpn_jax import kernels as kernels_lib
from gpn_jax.core import autodiff_window, gpn
from gpn_jax.core import loss as loss_lib
from gpn_jax.core.fused import layout as fused_layout
from gpn_jax.core.fused import loss as fused_loss
from gpn_jax.core.fused import window as fused_window
from gpn_jax.core.gpn import GPNCarry, Intervention
from gpn_jax.core.kernel_ops import MemoryKernels
from gpn_jax.core.norms import cast_matrices
from gpn_jax.models.base import SpecModel, masked_mean
from gpn_jax.models.configs import GPNConfig, ScanImpl  # defined there, JAX-free
from gpn_jax.models.params import (
    EMBED,
    FFN,
    HEADS,
    VOCAB,
    a_log_init,
    dt_bias_init,
    lecun,
    ones,
    param,
    small,
    swiglu_specs,
    zeros,
)


def param_specs(c: GPNConfig) -> dict:
    """Every GPN(+M) parameter with the paper's initialisation and its logical axes (see
    `gpn_jax.models.params`). Square mixing matrices that feed element-wise gates (`wpg`,
    `gate_w`) and the decode / ground projections stay whole over `heads`-like splits."""
    d, e, f = c.d_model, c.d_emb, c.d_ffn
    hk, hu, h = c.n_heads * c.d_key, c.n_heads * c.d_value, c.n_heads
    vec = lambda n, init=zeros: param(init, (n,))
    col = lambda init, n: param(init, (d, n), (EMBED, HEADS))  # (d, H*) column-parallel
    decode = {"norm": vec(d, ones), "proj": param(lecun, (d, e), (EMBED, None))}
    if c.decoder_bias:
        decode["bias"] = vec(e)
    tree = {
        "embed": param(small, (c.vocab_size, e), (VOCAB, EMBED)),
        "decode": decode,
        "ground": {
            "emb_norm": vec(e, ones),
            "fuse": param(lecun, (e, d), (EMBED, None)),
            "gate_norm": vec(d, ones),
            "gate_w": param(zeros, (d, d), (EMBED, None)),
            "gate_b": vec(d),
        },
    }
    if c.memory:
        tree["write"] = {
            "norm": vec(d, ones),
            "wk": col(lecun, hk),
            "bk": param(zeros, (hk,), (HEADS,)),
            "wv": col(lecun, hu),
            "wbeta": col(lecun, h),
            "wa": col(lecun, h),
            "A_log": param(a_log_init, (h,), (HEADS,)),
            "dt_bias": param(dt_bias_init, (h,), (HEADS,)),
        }
    for i in range(c.n_layers):
        layer = {
            "ffn_norm": vec(d, ones),
            **swiglu_specs(d, f, zeros),
            "pg_norm": vec(d, ones),
            "wpg": param(zeros, (d, d), (EMBED, None)),
            "bpg": vec(d),
        }
        if c.memory:
            layer |= {
                "read_norm": vec(d, ones),
                "wq": col(lecun, hk),
                "bq": param(zeros, (hk,), (HEADS,)),
                "wrg": col(lecun, hu),
                "out_norm": param(ones, (hu,), (HEADS,)),
                "wo": param(small, (hu, d), (HEADS, EMBED)),  # row-parallel
            }
        tree[f"layer_{i}"] = layer
    return tree


def weight_decay_mask(params) -> dict:
    """Decay matrices only: never norms, biases, A_log or dt_bias (all of which are vectors)."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


# ----------------------------------------------------------------------------- scan_impl
def _autodiff_ce_sum(cp, p_TxBxD, targets_TxB, chunk):
    return loss_lib.cross_entropy_sum(lambda p: gpn.decode(cp, p), p_TxBxD, targets_TxB, chunk)


def _ce_sum(scan_impl: ScanImpl):
    """The summed cross-entropy of `scan_impl`: (cp, p_TxBxD, targets_TxB, chunk) -> CE sum."""
    return fused_loss.cross_entropy_sum_fused if scan_impl is ScanImpl.FUSED else _autodiff_ce_sum


def _check_no_intervention(iv: Intervention) -> None:
    """The fused window has no interventions and says so rather than switching scans."""
    if any(x is not None for x in iv):
        raise ValueError(
            "scan_impl='fused' does not run interventions; use the reference scan "
            "(model.autodiff(), or scan_impl='autodiff' in the config)"
        )


class GPN(SpecModel):
    """GPN / GPN+M language model: pure functions over `params` (see `gpn_jax.models.base`)."""

    def __init__(
        self,
        config: GPNConfig,
        tensor_blocks: tuple[int, str | None] = (1, None),
        platform: str | None = None,
    ):
        """`tensor_blocks`: (tp, mesh axis) of the fused window's tensor-parallel layout, set by
        `partitioned` (what `parallel.spmd.DataParallel` runs); (1, None) on one device.
        `platform`: the one `model.kernels` is resolved for (None: `jax.default_backend()`;
        `on_platform` sets it, e.g. to compile for a TPU from a CPU host)."""
        self.config = config
        self.tensor_blocks = tensor_blocks
        self.platform = platform

    def on_platform(self, platform: str) -> "GPN":
        """The same model with its kernels resolved for `platform` ("cpu", "gpu", "tpu")."""
        return GPN(self.config, self.tensor_blocks, platform)

    def kernels(self) -> MemoryKernels | None:
        """The resolved `model.kernels` of the fused window (`gpn_jax.kernels.resolve`, cached:
        resolved once per process); None: the XLA formulas (and always for the autodiff scan).

        Raises:
          ValueError / kernels.KernelsUnavailable: an explicit choice this machine cannot run.
        """
        c = self.config
        if c.scan_impl is not ScanImpl.FUSED:
            return None
        platform = self.platform or jax.default_backend()
        return kernels_lib.resolve(c.kernels, platform, c.memory_dtype)

    # ------------------------------------------------------------------ parameters and state
    # init / param_axes / axis_sizes come from `param_specs` (models.base.SpecModel)
    param_specs = staticmethod(param_specs)

    def partitioned(self, splits: Mapping[str, tuple[str, int]]) -> "GPN":
        """The model to run with its logical axes split as `splits` ({axis: (mesh axis, size)},
        split axes only) under GSPMD: the fused window lays its matrices out in column blocks
        of whole memory heads and d_ffn columns, one per device of the axis that splits both
        (`core.fused.window`, "Tensor parallelism"); the autodiff scan needs nothing.

        Raises:
          ValueError: the fused window with heads and d_ffn split differently, or a split
            size that does not divide n_heads and d_ffn.
        """
        c = self.config
        wanted = (FFN, HEADS) if c.memory else (FFN,)
        present = [a for a in wanted if a in splits]
        if c.scan_impl is not ScanImpl.FUSED or not present:
            return self
        split = {splits[a] for a in present}
        if len(present) != len(wanted) or len(split) > 1:
            raise ValueError(
                f"scan_impl='fused' splits memory heads and d_ffn over one mesh axis; these "
                f"rules split {sorted((a, splits[a][0]) for a in present)}: use "
                "one axis for both, or --config.model.scan_impl=autodiff"
            )
        ((axis, n),) = split
        fused_layout.check_blocks(c.n_heads if c.memory else 0, c.d_ffn, n)
        return GPN(c, (n, axis), self.platform)

    def autodiff(self) -> "GPN":
        """The same model on the reference `autodiff` scan (what interventions need)."""
        return GPN(dataclasses.replace(self.config, scan_impl=ScanImpl.AUTODIFF))

    def init_state(self, batch_size: int) -> GPNCarry:
        c = self.config
        mem = (c.n_heads, c.d_key, c.d_value) if c.memory else None
        return gpn.init_carry(batch_size, c.d_model, mem, c.memory_dtype)

    def weight_decay_mask(self, params) -> dict:
        return weight_decay_mask(params)

    # ------------------------------------------------------------------ windows
    def _compute_params(self, params):
        return cast_matrices(params, self.config.compute_dtype)

    def predicted_states(
        self, params, tokens_BxT, carry=None, iv: Intervention = Intervention(), resets=None
    ):
        """Scan the window. Returns (StepOutput with (T, B, ...) leaves, final carry, compute params).

        `resets` (B, T) bool: the carry entering those positions is reset to the initial state
        (document starts, `models.base.document_starts`); None: no resets."""
        carry = self.init_state(tokens_BxT.shape[0]) if carry is None else carry
        if carry.M is not None:  # stored in memory_dtype whatever the caller's carry holds
            carry = carry._replace(M=carry.M.astype(self.config.memory_dtype))
        cp = self._compute_params(params)
        xg_TxBxD = gpn.grounding_inputs(cp, tokens_BxT.T)
        keep = None if resets is None else 1.0 - jnp.asarray(resets, jnp.float32).T
        segment = self.config.remat_segment
        if self.config.scan_impl is not ScanImpl.FUSED:
            carry, out = autodiff_window.scan_window(cp, carry, xg_TxBxD, segment, iv, keep)
            return out, carry, cp
        _check_no_intervention(iv)
        tp, axis = self.tensor_blocks  # its tensor-parallel layout (`partitioned`)
        carry, out = fused_window.scan_window_fused(
            cp, carry, xg_TxBxD, segment, keep_TxB=keep, tp=tp, tp_axis=axis,
            kernels=self.kernels(), remat_parallel=self.config.remat_parallel,
            unroll=self.config.scan_unroll,
        )  # fmt: skip
        return out, carry, cp

    def loss(
        self, params, tokens_BxT, carry=None, iv: Intervention = Intervention(), mask=None,
        resets=None,
    ):  # fmt: skip
        """Mean CE over all B*T positions, or over those where `mask` (broadcast to (B, T)) is
        True. Returns (loss, (carry, metrics)). `resets`: as for `predicted_states`."""
        out, carry, cp = self.predicted_states(params, tokens_BxT, carry, iv, resets)
        if mask is not None:
            decode = lambda p: gpn.decode(cp, p)
            ce_TxB = loss_lib.per_token_cross_entropy(
                decode, out.p, tokens_BxT.T, self.config.loss_chunk
            )
            loss = masked_mean(ce_TxB.T, mask)
            metrics = {"loss": loss, "state_rms": jnp.sqrt(jnp.mean(jnp.square(out.p)))}
            return loss, (carry, metrics)
        ce_sum = _ce_sum(self.config.scan_impl)
        total = ce_sum(cp, out.p, tokens_BxT.T, self.config.loss_chunk)
        loss = total / tokens_BxT.size
        metrics = {"loss": loss, "state_rms": jnp.sqrt(jnp.mean(jnp.square(out.p)))}
        return loss, (carry, metrics)

    def token_losses(
        self, params, tokens_BxT, carry=None, iv: Intervention = Intervention(), resets=None
    ):
        out, carry, cp = self.predicted_states(params, tokens_BxT, carry, iv, resets)
        decode = lambda p: gpn.decode(cp, p)
        ce_TxB = loss_lib.per_token_cross_entropy(
            decode, out.p, tokens_BxT.T, self.config.loss_chunk
        )
        return ce_TxB.T, carry

    def logits(self, params, tokens_BxT, carry=None, iv: Intervention = Intervention()):
        out, carry, cp = self.predicted_states(params, tokens_BxT, carry, iv)
        return jnp.swapaxes(gpn.decode(cp, out.p), 0, 1), carry

    # ------------------------------------------------------------------ decoding
    # The decoding state is (carry with the memory already written for the next token, p):
    # the step rotated so that each call ends on a prediction. O(1) in context length.
    def start_decode(self, params, carry: GPNCarry | None = None, batch_size: int = 1):
        carry = self.init_state(batch_size) if carry is None else carry
        cp = self._compute_params(params)
        M, out = gpn.predict(cp, carry)
        return gpn.decode(cp, out.p), (GPNCarry(carry.s, carry.s_prev, M), out.p)

    def decode_step(self, params, state, token_B):
        (carry, p) = state
        cp = self._compute_params(params)
        s_new = gpn.ground(cp["ground"], p, gpn.grounding_inputs(cp, token_B))
        observed = GPNCarry(s_new, None if carry.M is None else carry.s, carry.M)
        return self.start_decode(params, observed)

    # ------------------------------------------------------------------ accounting
    def flops_per_token(self, seq_len: int = 0) -> dict:
        """Analytic matmul FLOPs per token (2 per multiply-add); training = 3 x forward."""
        c = self.config
        d, e, f, v = c.d_model, c.d_emb, c.d_ffn, c.vocab_size
        hk, hu, h = c.n_heads * c.d_key, c.n_heads * c.d_value, c.n_heads
        macs = e * d + d * d + d * e + e * v  # ground (fuse + gate), decode
        per_layer = d * 2 * f + f * d + d * d
        if c.memory:
            macs += (
                d * (hk + hu + 2 * h) + 2 * h * c.d_key * c.d_value
            )  # write: projections, kM, kv^T
            per_layer += d * (hk + hu) + hu * d + h * c.d_key * c.d_value  # read
        macs += c.n_layers * per_layer
        return {"forward": 2 * macs, "train": 6 * macs}

    def bytes_per_token(self, batch_size: int, seq_len: int) -> dict:
        """Analytic memory traffic of one training step per token (bytes moved between the
        chip and its main memory / HBM, the roofline's denominator), on the `scan_impl` schedule.

        Assumes nothing stays in cache between two uses, so it is an upper estimate on a CPU
        whose caches hold a small model. Terms (w = compute dtype bytes, m = `memory_dtype` bytes,
        activations and cotangents float32):
          weights      the recurrent matrices are read every time step by the forward and by the
                       backward loop (3 x with remat: the forward reruns; with remat_parallel
                       the rerun reads them once per segment of S steps), shared by the B
                       sequences: passes * n_rec * w / B; decode + embedding read twice per
                       loss chunk of C positions and their float32 gradient read + written;
          weight_grads float32 accumulators of n_rec read + written once per fused segment of
                       S steps (`fused.window`), once per step under autodiff;
          activations  the per-step residuals (fused widths) written once and read once, plus
                       the predicted state, its cotangent, xg and its cotangent (and with
                       remat_parallel the memory read of each layer but the last,
                       written and read);
          memory       the (H, K, U) matrix per sequence: forward reads M, writes M', each layer
                       reads M'; the backward recomputes M' (read + write), reads M and each
                       layer's M' (5 + 2L passes in memory_dtype), its float32 cotangent read +
                       written;
          logits       (V,) float32 per position: logits written, read; their gradient written,
                       read by two matmuls.
        """
        c = self.config
        d, e, f, v, L = c.d_model, c.d_emb, c.d_ffn, c.vocab_size, c.n_layers
        hk, hu, h = c.n_heads * c.d_key, c.n_heads * c.d_value, c.n_heads
        w = jnp.dtype(c.compute_dtype).itemsize
        m = jnp.dtype(c.memory_dtype).itemsize
        B, T = batch_size, seq_len
        write_cols = hk + hu + 2 * h if c.memory else 0
        layer_cols = 2 * f + d + (hk + hu if c.memory else 0)
        n_rec = d * (write_cols + L * layer_cols) + L * (f + hu) * d + d * d
        S = c.remat_segment or fused_window.default_segment(T)
        C = loss_lib.chunk_size(T, c.loss_chunk)
        parallel = c.remat_parallel and c.scan_impl is ScanImpl.FUSED
        passes = 2 + (1 / S if parallel else 1) if c.remat_segment else 2
        per_step_grads = c.scan_impl is ScanImpl.AUTODIFF
        res_width = d + hk + write_cols + layer_cols + (L - 1) * (d + layer_cols) + 2 * d
        res_width += (L - 1) * hu if parallel else 0
        out = {
            "weights": passes * n_rec * w / B + (2 * w + 8) * (v * e + d * e) / (C * B),
            "weight_grads": 8 * n_rec / (B if per_step_grads else S * B),
            "activations": 4 * (2 * res_width + 8 * d),
            "memory": h * c.d_key * c.d_value * (m * (5 + 2 * L) + 8) if c.memory else 0,
            "logits": 5 * 4 * v,
        }
        out["train"] = sum(out.values())
        return out
