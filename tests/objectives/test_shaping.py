"""Soft overlong punishment and overlong filtering (docs/objectives.md#rewards-and-shaping)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_jax.objectives import shaping


def np_penalty(L, L_max, L_cache, factor):
    if L <= L_max - L_cache:
        return 0.0
    if L <= L_max:
        return factor * (L_max - L_cache - L) / L_cache
    return -factor


def test_dapo_operating_point_hand_values():
    lengths = jnp.array([[0, 16384, 16385, 18432, 20480, 20481]])
    got = np.asarray(shaping.overlong_penalty(lengths, max_length=20480, buffer=4096))
    np.testing.assert_allclose(got, [[0.0, 0.0, -1 / 4096, -0.5, -1.0, -1.0]], rtol=1e-6)
    half = np.asarray(shaping.overlong_penalty(lengths, max_length=20480, buffer=4096, factor=0.5))
    np.testing.assert_allclose(half, got * 0.5, rtol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 64), st.data())
def test_property_penalty_band(L_max, data):
    L_cache = data.draw(st.integers(1, L_max))
    lengths = np.array(data.draw(st.lists(st.integers(0, 2 * L_max), min_size=1, max_size=8)))
    got = np.asarray(shaping.overlong_penalty(jnp.asarray(lengths)[None], max_length=L_max, buffer=L_cache))[0]
    want = [np_penalty(L, L_max, L_cache, 1.0) for L in lengths]
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert np.all(got[lengths <= L_max - L_cache] == 0.0)
    assert np.all(got[lengths > L_max] == -1.0)
    assert np.all((got >= -1.0) & (got <= 0.0))


def test_bad_buffer_named():
    with pytest.raises(ValueError, match="L_cache"):
        shaping.overlong_penalty(jnp.zeros((1, 1)), max_length=10, buffer=11)


def test_overlong_filter():
    mask = jnp.ones((2, 2, 3), jnp.int32)
    out = shaping.overlong_filter(mask, jnp.array([[True, False], [False, True]]))
    assert out.dtype == mask.dtype
    np.testing.assert_array_equal(np.asarray(out).sum(-1), [[0, 3], [3, 0]])
    jitted = jax.jit(shaping.overlong_filter)(mask.astype(jnp.float32), jnp.ones((2, 2)))
    assert float(jnp.sum(jitted)) == 0.0
