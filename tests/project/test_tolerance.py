"""The float-comparison helpers every test's bound goes through."""

import numpy as np
import pytest

from tests.tolerance import assert_rel_close, f32_bound, rel_err


def test_f32_bound_is_margin_times_terms_times_float32_eps():
    assert f32_bound(1, 1) == float(np.finfo(np.float32).eps) == 2.0**-23
    assert f32_bound(256, 4) == 4 * 256 * 2.0**-23
    with pytest.raises(AssertionError):
        f32_bound(0, 1)
    with pytest.raises(AssertionError):
        f32_bound(8, 0.5)  # a margin below 1 would undercut the derivation


def test_rel_err_is_relative_to_the_norm_not_per_entry():
    want = np.array([1e3, 1e-6])
    got = want + np.array([0.0, 1e-6])  # the tiny entry off by 100 %, the array by 1e-9
    assert rel_err(got, want) == pytest.approx(1e-9)
    assert rel_err(np.ones(3), np.zeros(3)) == pytest.approx(np.sqrt(3))  # all-zero: ||actual||


def test_assert_rel_close_names_the_leaf_over_the_bound():
    want = {"a": np.ones(4), "b": np.ones(4)}
    got = {"a": np.ones(4), "b": np.ones(4) * 1.01}
    assert_rel_close(got, want, 0.02)
    with pytest.raises(AssertionError, match=r"\['b'\]"):
        assert_rel_close(got, want, f32_bound(4, 1), "params")
