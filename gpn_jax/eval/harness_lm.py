"""`GPNLM`: any gpn_jax run (GPN, GPN+M, Gated DeltaNet, Transformer++) as an lm-evaluation-
harness model, registered as "gpn_jax". Needs the `lm-eval` package (`pip install -e .[eval]`).

From Python / Colab::

    import lm_eval
    from gpn_jax.eval.harness_lm import GPNLM
    lm = GPNLM(workdir="/tmp/run", batch_size=16)
    results = lm_eval.simple_evaluate(model=lm, tasks=["lambada_openai"])

From the shell: `python -m gpn_jax.harness --model_args workdir=/tmp/run --tasks ...`.

Semantics follow the harness's HF causal model: `lm_eval.api.model.TemplateLM` splits each
(context, continuation) pair (trailing context spaces move to the continuation; the
continuation is what encoding the whole string adds after the context's tokens); an empty
context is a fresh sequence (the models' own start state stands for the BOS prefix);
greedy means every continuation token is the argmax; generation stops at the first `until`
string (and at eos) and is cut there. The scoring itself is `gpn_jax.eval.scoring`.
"""

import logging
import os

from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.models.utils import (
    handle_stop_sequences,
    normalize_gen_kwargs,
    postprocess_generated_text,
)
from lm_eval.utils import simple_parse_args_string
from tqdm import tqdm

from gpn_jax.checkpoints.restore import load_run, require_checkpoints
from gpn_jax.eval import sampling, scoring
from gpn_jax.eval.suite import run_tokenizer

log = logging.getLogger(__name__)

MODEL_ARGS = ("workdir", "step", "batch_size", "window", "tokenizer", "max_gen_toks", "seed")
# passed by lm_eval's CLI / simple_evaluate whatever the model; accepted and ignored
_HARNESS_ARGS = ("max_batch_size", "device")


def _int(name: str, value, low: int = 1) -> int:
    try:
        v = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"model_args {name} must be an integer, got {value!r}") from None
    if v < low or str(v) != str(value).strip():
        raise ValueError(f"model_args {name} must be an integer >= {low}, got {value!r}")
    return v


def check_model_args(args: dict) -> dict:
    """`--model_args` checked without restoring anything: known keys, integer values, a
    workdir holding checkpoints. Returns the integers given (step, batch_size, ...).
    `gpn_jax.harness` calls it before lm-eval indexes its ~14,000 task files (~12 s on 2
    cores), so a typo fails at once; `GPNLM` calls it too."""
    unknown = sorted(set(args) - {"run"} - set(MODEL_ARGS) - set(_HARNESS_ARGS))
    if unknown:
        raise ValueError(
            f"unknown --model_args key(s) {unknown}; gpn_jax accepts {','.join(MODEL_ARGS)}"
        )
    if (args.get("workdir") is None) == (args.get("run") is None):
        raise ValueError("gpn_jax needs --model_args workdir=<run directory>")
    if args.get("workdir") is not None:
        require_checkpoints(str(args["workdir"]))
    ints = {"step": 0, "window": 1, "max_gen_toks": 1, "seed": 0}
    got = {k: _int(k, args[k], low) for k, low in ints.items() if args.get(k) is not None}
    bs = args.get("batch_size")
    if bs is not None and not str(bs).startswith("auto"):  # 'auto...': the default
        got["batch_size"] = _int("batch_size", bs)
    return got


def scoring_model(run):
    """The run's model without segmented remat: segments only trade training memory for
    recomputation (the math is the same), and scoring streams pieces of any length, which
    need not be a multiple of the segment."""
    if not run.config.model.get("remat_segment", 0):
        return run.model
    import ml_collections

    from gpn_jax.models import factory

    block = ml_collections.ConfigDict(run.config.model.to_dict())
    block.remat_segment = 0
    block.remat_parallel = False  # how segments rerun: no segments, nothing to rerun
    return factory.build_model(block)


def no_fork_bootstrap() -> None:
    """Makes lm-eval bootstrap its metrics' standard errors in this process.

    Unless DISABLE_MULTIPROC is set, lm-eval forks a multiprocessing pool for the bootstrap, and
    forking a process that runs JAX (which holds threads) can deadlock it. The in-process
    bootstrap draws the same resamples (one RNG seeded per chunk), so every number is the same.
    A value the user set is kept."""
    os.environ.setdefault("DISABLE_MULTIPROC", "1")


@register_model("gpn_jax")
class GPNLM(TemplateLM):
    """A restored gpn_jax run behind lm-eval's `LM` interface.

    Args (all also `--model_args key=value`):
      workdir: the run's directory (its newest readable checkpoint is loaded).
      step: a checkpoint step instead of the newest.
      batch_size: rows per forward pass ('auto' means the default, 16).
      window: tokens streamed per call by the recurrent families (default: the training
        seq_len, at most 256).
      tokenizer: a SentencePiece model instead of the run's `tokenizer.model`.
      max_gen_toks: default generation limit (the harness's default is 256).
      seed: sampling seed when a task asks for `do_sample`.
      run: an already restored run (`gpn_jax.checkpoints.restore.load_run`) instead of workdir.
    """

    def __init__(self, workdir=None, run=None, **kwargs):
        super().__init__()
        no_fork_bootstrap()
        given = check_model_args(dict(kwargs, workdir=workdir, run=run))
        self.run = run if run is not None else load_run(str(workdir), given.get("step"))
        self.model, self.params = scoring_model(self.run), self.run.params
        self.tok = run_tokenizer(self.run, kwargs.get("tokenizer"))
        self.batch_size = given.get("batch_size", 16)  # 'auto' means the default
        self.window = given.get("window", min(self.run.config.train.seq_len, 256))
        self.max_gen_toks = given.get("max_gen_toks", 256)
        self.seed = given.get("seed", 0)
        self.stats = scoring.Stats()

    @classmethod
    def create_from_arg_obj(cls, arg_dict: dict, additional_config: dict | None = None):
        """lm-eval's constructor hook. Its CLI always passes `batch_size` (its --batch_size,
        default 1) beside --model_args; a `batch_size` in --model_args wins."""
        extra = {k: v for k, v in (additional_config or {}).items()
                 if v is not None and k not in arg_dict}  # fmt: skip
        return cls(**arg_dict, **extra)

    @classmethod
    def create_from_arg_string(cls, arg_string: str, additional_config: dict | None = None):
        return cls.create_from_arg_obj(simple_parse_args_string(arg_string), additional_config)

    # ---------------------------------------------------------------- tokenizer
    @property
    def eot_token_id(self) -> int:
        return self.tok.eos_id

    @property
    def prefix_token_id(self) -> int:
        return self.tok.bos_id

    @property
    def tokenizer_name(self) -> str:
        return self.tok.path or "sentencepiece"

    def tok_encode(self, string: str, add_special_tokens=None, **kwargs) -> list[int]:
        """Plain ids: the tokenizer adds no BOS / EOS (the model's fresh state is the BOS)."""
        return self.tok.encode(string)

    def tok_decode(self, ids) -> str:
        return self.tok.decode(ids)

    # ---------------------------------------------------------------- requests
    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs):
        pairs = []
        for (context, _), context_enc, cont_enc in requests:
            if context == "":  # TemplateLM put the BOS prefix in front: a fresh sequence
                context_enc = []
            pairs.append((context_enc, cont_enc))
        before = self.stats.truncated
        out = scoring.loglikelihood(
            self.model, self.params, pairs, self.batch_size, self.window, self.stats
        )
        self._log_truncation(before, "loglikelihood")
        for (request, _, _), answer in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood", request, answer)
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        docs = [self.tok_encode(string) for (string,) in (r.args for r in requests)]
        out = scoring.rolling(
            self.model, self.params, docs, self.batch_size, self.window, self.prefix_token_id
        )
        for r, answer in zip(requests, out, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", r.args, answer)
        return out

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        eos = self.tok_decode([self.eot_token_id])
        before = self.stats.truncated
        out = []
        for r in tqdm(requests, disable=disable_tqdm, desc="generate_until"):
            context, gen_kwargs = r.args
            out.append(self._generate_one(context, dict(gen_kwargs or {}), eos))
            self.cache_hook.add_partial("generate_until", r.args, out[-1])
        self._log_truncation(before, "generate_until")
        return out

    def _generate_one(self, context: str, gen_kwargs: dict, eos: str) -> str:
        kwargs = normalize_gen_kwargs(gen_kwargs, self.max_gen_toks)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        max_new = int(kwargs.pop("max_gen_toks"))
        cfg = sampling.SamplingConfig(
            temperature=float(kwargs.get("temperature", 0.0) or 0.0),
            top_k=int(kwargs.get("top_k", 0) or 0),
            top_p=float(kwargs.get("top_p", 1.0) or 1.0),
            greedy=not kwargs.get("do_sample", False),
        )
        stop = lambda ids: any(s and s in self.tok_decode(ids) for s in until)
        ids = scoring.generate(self.model, self.params, self.tok_encode(context), max_new, cfg,
                               self.window, stop, self.stats, self.seed, self.eot_token_id)  # fmt: skip
        return postprocess_generated_text(self.tok_decode(ids), until, None)

    def _log_truncation(self, before: int, what: str) -> None:
        if self.stats.truncated > before:
            log.warning(
                "%s: %d input(s) longer than the model's context (max_seq_len %s) were cut "
                "from the left, as the harness does",
                what,
                self.stats.truncated - before,
                getattr(self.model.config, "max_seq_len", None),
            )
