"""gpn_jax: Grounded Prediction Networks in JAX/Flax.

    import gpn_jax
    lm = gpn_jax.load("runs/demo_model")   # a directory written by `gpn-export`
    print(lm.generate("The built-in function", max_new_tokens=40))

Importing the package is cheap: JAX and the rest load when `load` is called.
"""

import dataclasses

from gpn_jax.io.platforms import keep_libtpu_quiet as _keep_libtpu_quiet

_keep_libtpu_quiet()  # before JAX starts: no libtpu probe on a host without a TPU

__version__ = "0.1.0"  # the one place the version is written (setup.cfg reads it)

__all__ = ["__version__", "load", "LoadedModel"]


@dataclasses.dataclass(frozen=True)
class LoadedModel:
    """An exported model: what `gpn_jax.eval.sampling.generate` needs, and a text shortcut."""

    config: object  # the run's ml_collections ConfigDict
    model: object
    params: dict
    tokenizer: object  # gpn_jax.data.tokenizer.Tokenizer, None for a run without one
    step: int

    def generate(
        self,
        prompt: str,
        max_new_tokens: int = 64,
        *,
        temperature: float = 1.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
    ) -> str:
        """`prompt` and one sampled continuation, decoded (stops at the end-of-text token)."""
        from gpn_jax.eval import sampling

        if self.tokenizer is None:
            raise ValueError(
                "this model has no tokenizer; call gpn_jax.eval.sampling.generate with token ids"
            )
        ids = self.tokenizer.encode(prompt)
        cfg = sampling.SamplingConfig(temperature, top_k, top_p)
        out = sampling.generate(
            self.model, self.params, ids, max_new_tokens, cfg, seed=seed,
            eos_id=self.tokenizer.eos_id,
        )  # fmt: skip
        return self.tokenizer.decode(ids + out["tokens"][0])


def load(model_dir: str) -> LoadedModel:
    """The model in `model_dir` (written by `gpn-export`): config, model, params, tokenizer.

    Raises:
      ValueError: not a model directory, or files that disagree with its config.json (one line).
    """
    from gpn_jax.checkpoints.model_dir import load_model_dir

    run = load_model_dir(model_dir)
    return LoadedModel(run.config, run.model, run.params, run.tokenizer, run.step)
