"""Metric pairs: masked sums / mins / maxes, combination over micro-batches, finalisation."""

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.objectives import diagnostics as diag


def test_masked_pairs_and_all_masked():
    x = jnp.array([[1.0, 2.0, jnp.nan], [4.0, -1.0, 0.0]])
    m = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert [float(v) for v in diag.masked_sum_count(x, m)] == [7.0, 3.0]
    assert float(diag.masked_min_count(x, m)[0]) == 1.0 and float(diag.masked_max_count(x, m)[0]) == 4.0
    empty = {"a": diag.masked_sum_count(x, jnp.zeros_like(m)), "r_min": diag.masked_min_count(x, jnp.zeros_like(m))}
    out = jax.jit(diag.finalize_metrics)(empty)  # jit-able: the trainer may finalise on device
    assert {k: float(v) for k, v in out.items()} == {"a": 0.0, "r_min": 0.0}


def test_combine_equals_whole_batch():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(6, 5)).astype(np.float32)
    m = (rng.random((6, 5)) < 0.6).astype(np.float32)

    def metrics(xs, ms):
        return {"v": diag.masked_sum_count(xs, ms), "v_min": diag.masked_min_count(xs, ms),
                "v_max": diag.masked_max_count(xs, ms), "advantage_mean": diag.masked_sum_count(xs, ms),
                "advantage_sq_mean": diag.masked_sum_count(xs**2, ms)}

    whole = diag.finalize_metrics(metrics(x, m))
    parts = diag.finalize_metrics(diag.combine_metrics([metrics(x[:2], m[:2]), metrics(x[2:], m[2:])]))
    for k in whole:
        np.testing.assert_allclose(parts[k], whole[k], rtol=1e-6)
    vals = x[m > 0]
    np.testing.assert_allclose(whole["v"], vals.mean(), rtol=1e-5)
    np.testing.assert_allclose([whole["v_min"], whole["v_max"]], [vals.min(), vals.max()])
    np.testing.assert_allclose(whole["advantage_std"], vals.std(), rtol=1e-4)


def test_zero_advantage_groups():
    a = jnp.zeros((3, 2, 2)).at[1, 0, 0].set(0.5).at[2, 1, 1].set(3.0)
    m = jnp.ones((3, 2, 2)).at[2, 1, 1].set(0.0)  # group 2's only non-zero is on padding
    z, n = diag.zero_advantage_groups(a, m)
    assert (float(z), float(n)) == (2.0, 3.0)


def test_combine_stacked_equals_combining_the_list():
    rng = np.random.default_rng(3)
    parts = [
        {"clip_frac_low": (jnp.float32(rng.random()), jnp.float32(5.0)),
         "ratio_min": (jnp.float32(rng.random()), jnp.float32(5.0)),
         "ratio_max": (jnp.float32(rng.random() + 1), jnp.float32(4.0))}
        for _ in range(3)
    ]
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *parts)
    got, want = diag.combine_stacked(stacked), diag.combine_metrics(parts)
    for name in want:
        np.testing.assert_allclose(np.asarray(got[name][0]), np.asarray(want[name][0]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(got[name][1]), np.asarray(want[name][1]))
    assert float(got["ratio_min"][0]) == min(float(p["ratio_min"][0]) for p in parts)
    assert float(got["ratio_max"][0]) == max(float(p["ratio_max"][0]) for p in parts)
