"""Generates text from a trained run.

    python -m gpn_jax.generate --workdir=/tmp/run --prompt="The list" --max_new_tokens=64 \\
        [--greedy | --temperature=0.8 --top_k=40 --top_p=0.95] --seed=0 --num_samples=2

`--model_dir=<dir>` (a `gpn_jax.export` directory) instead of `--workdir` samples from an
exported model.

The prompt is observed token by token through the model's decoding state (O(1) in the
context for GPN / GPN+M: no growing cache), then tokens are sampled with one jitted step.
Runs without a tokenizer (e.g. recall) take `--prompt_ids=3,40,7` and print ids.
"""

from absl import flags

from gpn_jax.io import cli

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory holding checkpoints.")
_MODEL_DIR = flags.DEFINE_string("model_dir", None, "Exported model (gpn_jax.export) instead.")
_PROMPT = flags.DEFINE_string("prompt", "", "Prompt text.")
_PROMPT_IDS = flags.DEFINE_list("prompt_ids", None, "Prompt token ids (instead of --prompt).")
_MAX_NEW = flags.DEFINE_integer("max_new_tokens", 64, "Tokens to generate at most.")
_GREEDY = flags.DEFINE_bool("greedy", False, "Argmax decoding (same as --temperature=0).")
_TEMPERATURE = flags.DEFINE_float("temperature", 1.0, "Sampling temperature (0: greedy).")
_TOP_K = flags.DEFINE_integer("top_k", 0, "Sample from the k most likely tokens (0: all).")
_TOP_P = flags.DEFINE_float("top_p", 1.0, "Nucleus sampling mass (1.0: off).")
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
_NUM = flags.DEFINE_integer("num_samples", 1, "Independent samples of the same prompt.")
_STOP_EOS = flags.DEFINE_bool("stop_at_eos", True, "Stop a sample at the eos token.")
_STEP = flags.DEFINE_integer("step", None, "Checkpoint step (default: the newest readable one).")
_TOKENIZER = flags.DEFINE_string("tokenizer_path", None, "Tokenizer to use instead of the run's.")


def _prompt_ids(run, tokenizer) -> list[int]:
    if _PROMPT_IDS.value is not None:
        try:
            ids = [int(i) for i in _PROMPT_IDS.value]
        except ValueError:
            raise ValueError(f"--prompt_ids must be integers, got {_PROMPT_IDS.value}") from None
        vocab = run.config.model.vocab_size
        if any(not 0 <= i < vocab for i in ids):
            raise ValueError(f"--prompt_ids must lie in [0, {vocab})")
        return ids
    if tokenizer is None:
        raise ValueError(
            f"run {run.workdir} has no tokenizer; pass --prompt_ids or --tokenizer_path"
        )
    return tokenizer.encode(_PROMPT.value)


def _check_prompt_text(prompt: str) -> None:
    """A prompt whose bytes are not UTF-8 (argv decodes them to lone surrogates) is one line."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError as e:
        byte = ord(prompt[e.start]) & 0xFF  # surrogateescape keeps the raw byte in U+DC80..DCFF
        raise ValueError(
            f"--prompt is not UTF-8 text (byte 0x{byte:02x} at character {e.start}); pass UTF-8 "
            "text, or token ids with --prompt_ids"
        ) from None


def _sampling_flags(sampling):
    """The sampling config of the flags, every flag in range (one line naming the flag)."""
    try:
        sampling.check_generation(_MAX_NEW.value, _SEED.value, _NUM.value)
        return sampling.SamplingConfig(
            _TEMPERATURE.value, _TOP_K.value, _TOP_P.value, _GREEDY.value
        )
    except ValueError as e:
        raise ValueError(f"--{e}") from None


def generate(workdir: str | None, model_dir: str | None = None) -> list:
    from gpn_jax.checkpoints.model_dir import load_either
    from gpn_jax.eval import sampling
    from gpn_jax.eval.suite import run_tokenizer

    cli.settle_heap()  # the imported stack out of the garbage collector's passes
    cfg = _sampling_flags(sampling)  # before the run is loaded: a bad flag costs nothing
    _check_prompt_text(_PROMPT.value)
    run = load_either(workdir, model_dir, _STEP.value)
    tokenizer = None
    if _TOKENIZER.value or run.tokenizer is not None:
        tokenizer = run_tokenizer(run, _TOKENIZER.value)
    prompt = _prompt_ids(run, tokenizer)
    eos = tokenizer.eos_id if (tokenizer is not None and _STOP_EOS.value) else None
    out = sampling.generate(
        run.model,
        run.params,
        prompt,
        _MAX_NEW.value,
        cfg,
        seed=_SEED.value,
        num_samples=_NUM.value,
        eos_id=eos,
    )
    if out["truncated"]:
        print(
            f"(generation stopped at the model's context limit of {sampling.context_limit(run.model)} tokens)"
        )
    for i, ids in enumerate(out["tokens"]):
        text = (
            tokenizer.decode(prompt + ids)
            if tokenizer is not None
            else " ".join(map(str, prompt + ids))
        )
        if len(out["tokens"]) > 1:
            print(f"--- sample {i}")
        print(text)
    return out["tokens"]


def _body():
    return generate(_WORKDIR.value, _MODEL_DIR.value)


main, run = cli.absl_entry(_body, "gpn-generate")


if __name__ == "__main__":
    run()
