"""What every model family offers the training, evaluation and analysis code.

A model object holds only its frozen config; every method is a pure function of
`params` (a plain nested dict), so it can be jitted, sharded and differentiated freely.

Convention shared by all families: in a window `tokens` (B, T), position t is predicted
from the carry plus `tokens[:, :t]`, so every position (position 0 included) is scored.
A model without a natural recurrent state (Transformer++) predicts position 0 of a fresh
sequence from a BOS token and carries nothing across windows.
"""

from typing import Any, Protocol

import jax
import jax.numpy as jnp

from gpn_jax.models import params as params_lib
from gpn_jax.models.params import FFN, HEADS, VOCAB

Array = jax.Array
Params = dict
Carry = Any
DecodeState = Any


def masked_mean(ce_BxT: Array, mask) -> Array:
    """Mean of `ce` where `mask` (broadcast to (B, T)) is True: the models' masked loss, e.g.
    the answer positions of associative recall."""
    m = jnp.broadcast_to(jnp.asarray(mask, jnp.float32), ce_BxT.shape)
    return jnp.sum(ce_BxT * m) / jnp.maximum(jnp.sum(m), 1.0)


def document_starts(tokens_BxT: Array, eos_id: int) -> Array:
    """(B, T) bool: True where the previous token of the window is the document separator, so
    that position starts a document and its incoming carry is reset (stateful training).

    Position 0 is never marked: whether the previous window ended with EOS is handled by
    `reset_after_eos` on that window's final carry, which is the same reset."""
    prev_is_eos = tokens_BxT[:, :-1] == eos_id
    return jnp.pad(prev_is_eos, ((0, 0), (1, 0)))


def reset_after_eos(model, carry: Carry, tokens_BxT: Array, eos_id: int) -> Carry:
    """The final carry of a window, reset to the initial state in the rows whose last token is
    the document separator, so the next window's first position starts a document."""
    ended = tokens_BxT[:, -1] == eos_id  # (B,)
    fresh = model.init_state(tokens_BxT.shape[0])

    def pick(c, f):
        return jnp.where(ended.reshape(-1, *([1] * (c.ndim - 1))), f.astype(c.dtype), c)

    return jax.tree.map(pick, carry, fresh)


class LanguageModel(Protocol):
    config: Any

    def init(self, rng: Array) -> Params:
        """Initial parameters (the paper's initialisation for GPN)."""

    def param_axes(self) -> dict[str, tuple]:
        """{'layer_0/w1': ('embed', 'ffn'), ...}: each parameter's logical axis name per dimension
        (`gpn_jax.models.params`), which `gpn_jax.parallel.sharding` maps to mesh axes."""

    def axis_sizes(self) -> dict[str, int]:
        """{logical axis: the model size it must split evenly}, e.g. {'heads': n_heads}."""

    def partitioned(self, splits: dict[str, tuple[str, int]]) -> "LanguageModel":
        """The model to run with its logical axes split as `splits` ({logical axis: (mesh
        axis, size)}, split axes only): itself, or a copy laid out for that split. Raises
        ValueError (one line) if the model cannot run with these axes split."""

    def init_state(self, batch_size: int) -> Carry:
        """Carry for `batch_size` fresh sequences."""

    def loss(
        self, params: Params, tokens: Array, carry: Carry = None, mask: Array | None = None
    ) -> tuple[Array, tuple]:
        """Mean CE over all B*T positions (or over those where `mask`, broadcast to (B, T), is
        True). Returns (loss, (new_carry, metrics))."""

    def token_losses(self, params: Params, tokens: Array, carry: Carry = None):
        """Per-position CE (B, T) and the new carry."""

    def logits(self, params: Params, tokens: Array, carry: Carry = None):
        """Full (B, T, V) logits and the new carry (evaluation on short windows only)."""

    def start_decode(
        self, params: Params, carry: Carry = None, batch_size: int = 1
    ) -> tuple[Array, DecodeState]:
        """Logits (B, V) of the next token after `carry` (None: `batch_size` fresh sequences)."""

    def decode_step(self, params: Params, state: DecodeState, token: Array):
        """Observe `token` (B,); return logits (B, V) of the following token and the new state."""

    def weight_decay_mask(self, params: Params) -> Any:
        """Pytree of bools: True where weight decay applies (matrices only)."""

    def flops_per_token(self, seq_len: int) -> dict:
        """Analytic {'forward': f, 'train': 3f} matmul FLOPs per token."""


class SpecModel:
    """The parameter methods every family shares, derived from its `param_specs(config)` (the
    initialiser, shape and logical axes of each parameter, declared once in the family's
    module). A family sets `param_specs = staticmethod(param_specs)` and may override
    `partitioned` where its kernels need a layout for, or cannot run with, some axes split."""

    param_specs = None

    def init(self, rng: Array) -> Params:
        return params_lib.init_params(self.param_specs(self.config), rng)

    def param_axes(self) -> dict:
        return params_lib.flat_axes(self.param_specs(self.config))

    def axis_sizes(self) -> dict:
        c = self.config
        return {HEADS: c.n_heads, FFN: c.d_ffn, VOCAB: c.vocab_size}

    def partitioned(self, splits) -> "SpecModel":
        """Every split of the logical axes runs as is."""
        del splits
        return self
