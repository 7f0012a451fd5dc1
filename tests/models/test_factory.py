"""The family record (`models.factory`): each variant's block at a width builds, is read back
as that variant, and its family's `recurrent` says whether the model carries a state."""

import pytest

from gpn_jax.models import factory

SIZE = factory.Width(width=32, vocab=16, max_len=24, heads=2)


@pytest.mark.parametrize("key", sorted(factory.VARIANTS))
def test_each_variant_builds_at_a_width_and_is_read_back_from_its_block(key):
    block = factory.at_width(key, SIZE)
    assert factory.variant(block).key == key
    model = factory.build_model(block)
    assert type(model).__name__ == factory.family(block).model_class
    assert factory.config_fields(block) >= set(block) - {"family"}


@pytest.mark.parametrize("name", sorted(factory.FAMILIES))
def test_recurrent_means_the_model_carries_a_state_across_windows(name):
    key = factory.FAMILIES[name].variants[0].key
    model = factory.build_model(factory.at_width(key, SIZE))
    assert (model.init_state(2) is not None) == factory.FAMILIES[name].recurrent


def test_labels_are_unique_and_a_bad_key_is_one_line():
    labels = [v.label for _, v in factory.VARIANTS.values()]
    assert len(set(labels)) == len(labels)
    assert factory.variant_keys(" gpn_m, gdn ") == ["gpn_m", "gdn"]
    with pytest.raises(ValueError, match=r"unknown models \['rnn'\]; choose from gpn_m,"):
        factory.variant_keys("gpn_m,rnn")


def test_matched_variants_are_within_one_ffn_step_of_gpn_m():
    target = factory.n_params(factory.at_width(factory.REFERENCE, SIZE))
    for key in factory.VARIANTS:
        fields = factory.matched(key, SIZE)
        step = factory.n_params(fields | {"d_ffn": fields["d_ffn"] + 8}) - factory.n_params(fields)
        assert abs(factory.n_params(fields) - target) <= step / 2 + 1, key
