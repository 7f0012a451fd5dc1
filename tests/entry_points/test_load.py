"""`gpn_jax.load(dir)`'s model: its `generate` is `eval.sampling.generate` on the tokenizer's ids,
decoded; and `load` reads an exported directory through `checkpoints.model_dir`."""

import jax
import pytest

import gpn_jax
from gpn_jax.eval import sampling
from gpn_jax.models.gpn import GPN, GPNConfig


class _Letters:
    """A tokenizer over 'a'..'z' (ids 3..28), eos 2."""

    eos_id = 2

    def encode(self, text):
        return [3 + ord(c) - ord("a") for c in text]

    def decode(self, ids):
        return "".join(chr(ord("a") + i - 3) if i >= 3 else "|" for i in ids)


@pytest.fixture(scope="module")
def loaded():
    cfg = GPNConfig(vocab_size=32, d_model=16, d_emb=8, d_ffn=32, n_heads=2, d_key=4, d_value=8)
    model = GPN(cfg)
    params = model.init(jax.random.PRNGKey(0))
    return gpn_jax.LoadedModel({}, model, params, _Letters(), step=0)


def test_generate_is_sampling_on_the_tokenizers_ids(loaded):
    text = loaded.generate("abc", max_new_tokens=5, temperature=0.7, top_k=8, seed=3)
    ids = [3, 4, 5]
    cfg = sampling.SamplingConfig(0.7, 8, 1.0)
    out = sampling.generate(loaded.model, loaded.params, ids, 5, cfg, seed=3, eos_id=2)
    assert text == _Letters().decode(ids + out["tokens"][0])
    assert text.startswith("abc")


def test_a_model_without_tokenizer_says_what_to_do(loaded):
    bare = gpn_jax.LoadedModel({}, loaded.model, loaded.params, None, step=0)
    with pytest.raises(ValueError, match="has no tokenizer; call gpn_jax.eval.sampling.generate"):
        bare.generate("abc")


def test_load_of_a_directory_that_is_no_export_is_one_line(tmp_path):
    with pytest.raises(ValueError) as raised:
        gpn_jax.load(str(tmp_path))
    assert "\n" not in str(raised.value) and str(tmp_path) in str(raised.value)
