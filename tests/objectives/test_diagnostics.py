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


def np_clip_histograms(old_logp, ratio, adv, mask, eps_low, eps_high):
    """The histograms with explicit loops: fractions of the valid tokens (float32 values and edges, as
    the trainer's: float32(0.9) < 0.9, so a ratio of float32(0.9) is in [0.9, 1.0) on both sides)."""
    edges = np.float32([0.8, 0.9, 1.0, 1.1, 1.2, 1.28])
    want = {f"{n}_{k}": 0.0 for n in ("clip_high_p_old", "clip_low_p_old") for k in range(10)}
    want.update({f"{n}_{k}": 0.0 for n in ("ratio_pos", "ratio_neg") for k in range(7)})
    want["clip_high_possible"] = 0.0
    valid = 0
    for i in np.ndindex(mask.shape):
        if mask[i] == 0:
            continue
        valid += 1
        p, r, a = np.exp(np.float32(old_logp[i])), np.float32(ratio[i]), float(adv[i])
        pk = min(int(np.floor(p * np.float32(10))), 9)
        rk = sum(r >= e for e in edges)
        if a > 0 and r > 1 + eps_high:
            want[f"clip_high_p_old_{pk}"] += 1
        if a < 0 and r < 1 - eps_low:
            want[f"clip_low_p_old_{pk}"] += 1
        if a > 0:
            want[f"ratio_pos_{rk}"] += 1
            want["clip_high_possible"] += float(p * np.float32(1 + eps_high) < 1)
        if a < 0:
            want[f"ratio_neg_{rk}"] += 1
    return {k: v / max(valid, 1) for k, v in want.items()}


def test_clip_histograms_match_numpy_and_split_over_micro_batches():
    rng = np.random.default_rng(5)
    shape = (4, 3, 7)
    old = np.log(rng.uniform(0.001, 1.0, shape)).astype(np.float32)
    old[0, 0, :3] = np.log(np.float32([0.1, 1.0, 0.95]))  # a bin edge, π_old = 1, the last bin
    ratio = rng.uniform(0.6, 1.5, shape).astype(np.float32)
    ratio[1, 0, :6] = [0.8, 0.9, 1.0, 1.2, 1.28, 1.21]  # exactly on the edges: the bin above
    adv = np.repeat(rng.normal(size=shape[:2]).astype(np.float32)[..., None], shape[2], -1)
    adv[2] = 0.0  # a zero-advantage group: in no ratio bin
    mask = (rng.random(shape) < 0.8).astype(np.float32)
    mask[3] = 0.0
    got = diag.finalize_metrics(jax.jit(lambda *a: diag.clip_histograms(*a, eps_low=0.2, eps_high=0.2))(
        old, ratio, adv, mask))
    want = np_clip_histograms(old, ratio, adv, mask, 0.2, 0.2)
    assert set(got) == set(want)
    for k in want:
        np.testing.assert_allclose(float(got[k]), want[k], atol=1e-7, err_msg=k)
    assert sum(want[f"clip_high_p_old_{k}"] for k in range(10)) > 0  # the case is not vacuous
    split = diag.finalize_metrics(diag.combine_metrics(
        [diag.clip_histograms(old[s], ratio[s], adv[s], mask[s], eps_low=0.2, eps_high=0.2)
         for s in (slice(0, 1), slice(1, 4))]))
    for k in want:
        np.testing.assert_allclose(float(split[k]), float(got[k]), rtol=1e-6, atol=1e-8)


def test_clip_histograms_add_up_to_the_clip_fractions_of_the_objective():
    from dapo_jax.objectives import ObjectiveConfig, objective_terms

    rng = np.random.default_rng(2)
    shape = (3, 4, 9)
    old = np.log(rng.uniform(0.01, 1.0, shape)).astype(np.float32)
    logp = (old + rng.normal(size=shape) * 0.3).astype(np.float32)
    mask = (rng.random(shape) < 0.7).astype(np.float32)
    adv = rng.normal(size=shape[:2]).astype(np.float32)
    for eps_high in (0.2, 0.28):
        cfg = ObjectiveConfig(eps_low=0.2, eps_high=eps_high)
        _, _, metrics = objective_terms(cfg, logp=logp, old_logp=old, advantages=adv, mask=mask)
        out = {k: float(v) for k, v in diag.finalize_metrics(metrics).items()}
        assert out["clip_frac_high"] > 0 and out["clip_frac_low"] > 0
        np.testing.assert_allclose(sum(out[f"clip_high_p_old_{k}"] for k in range(10)), out["clip_frac_high"], rtol=1e-5)
        np.testing.assert_allclose(sum(out[f"clip_low_p_old_{k}"] for k in range(10)), out["clip_frac_low"], rtol=1e-5)
        # the upper clip binds only where it can: π_old < 1 / (1 + ε_high)
        assert 0 < out["clip_frac_high"] <= out["clip_high_possible"]
        # every token with A != 0 is in one ratio bin
        valid = mask > 0
        nonzero = np.broadcast_to(adv[..., None], shape) != 0
        np.testing.assert_allclose(sum(out[f"ratio_pos_{k}"] + out[f"ratio_neg_{k}"] for k in range(7)),
                                   (valid & nonzero).sum() / valid.sum(), rtol=1e-5)
        # the mass in [1.2, 1.28) with A > 0 is what the symmetric clip stops and clip-higher does not
        ratio = np.exp(logp - old)
        pos = np.broadcast_to(adv[..., None], shape) > 0
        np.testing.assert_allclose(out["ratio_pos_5"], (valid & pos & (ratio >= 1.2) & (ratio < 1.28)).sum() / valid.sum(),
                                   rtol=1e-5)


def test_clip_grad_shares_match_numpy_and_split_over_micro_batches():
    rng = np.random.default_rng(7)
    shape = (4, 3, 6)
    ratio = np.exp(rng.normal(size=shape) * 0.3).astype(np.float32)
    adv = np.broadcast_to(rng.normal(size=shape[:2])[..., None], shape).astype(np.float32)
    mask = (rng.random(shape) < 0.8).astype(np.float32)
    norms = rng.uniform(0.1, 3.0, shape).astype(np.float32)
    a = np.abs(adv) * ratio * norms * mask  # each token's unclipped output-layer gradient norm
    want_high = a[(adv > 0) & (ratio > 1.28)].sum() / a.sum()
    want_low = a[(adv < 0) & (ratio < 0.8)].sum() / a.sum()
    assert want_high > 0 and want_low > 0
    whole = diag.finalize_metrics(diag.clip_grad_shares(ratio, adv, mask, norms, eps_low=0.2, eps_high=0.28))
    np.testing.assert_allclose(float(whole["clip_grad_share_high"]), want_high, rtol=1e-5)
    np.testing.assert_allclose(float(whole["clip_grad_share_low"]), want_low, rtol=1e-5)
    parts = [diag.clip_grad_shares(ratio[i:i + 2], adv[i:i + 2], mask[i:i + 2], norms[i:i + 2], eps_low=0.2,
                                   eps_high=0.28) for i in (0, 2)]
    split = diag.finalize_metrics(diag.combine_metrics(parts))
    np.testing.assert_allclose(float(split["clip_grad_share_high"]), want_high, rtol=1e-5)
    # a token's count is not its gradient: the same clipped tokens with larger norms get a larger share
    heavier = np.where((adv > 0) & (ratio > 1.28), 10 * norms, norms)
    more = diag.finalize_metrics(diag.clip_grad_shares(ratio, adv, mask, heavier, eps_low=0.2, eps_high=0.28))
    assert float(more["clip_grad_share_high"]) > 2 * want_high


def test_objective_terms_log_the_grad_shares_only_when_given_norms():
    import pytest

    from dapo_jax.objectives import ObjectiveConfig, objective_terms

    rng = np.random.default_rng(3)
    shape = (2, 4, 5)
    old = np.log(rng.uniform(0.05, 1.0, shape)).astype(np.float32)
    logp = (old + rng.normal(size=shape) * 0.4).astype(np.float32)
    mask = np.ones(shape, np.float32)
    adv = rng.normal(size=shape[:2]).astype(np.float32)
    cfg = ObjectiveConfig(eps_low=0.2, eps_high=0.28, clip_grad_share=True)
    loss0, _, plain = objective_terms(cfg, logp=logp, old_logp=old, advantages=adv, mask=mask)
    loss1, _, with_norms = objective_terms(cfg, logp=logp, old_logp=old, advantages=adv, mask=mask,
                                           grad_norms=np.ones(shape, np.float32))
    assert "clip_grad_share_high" not in plain and float(loss0) == float(loss1)  # a diagnostic: the loss is unchanged
    out = diag.finalize_metrics(with_norms)
    r = np.exp(logp - old)
    a = np.abs(np.broadcast_to(adv[..., None], shape)) * r  # unit norms: the share is the |A| ρ mass
    high = (np.broadcast_to(adv[..., None], shape) > 0) & (r > 1.28)
    np.testing.assert_allclose(float(out["clip_grad_share_high"]), a[high].sum() / a.sum(), rtol=1e-5)
    with pytest.raises(ValueError, match="clip_grad_share"):
        ObjectiveConfig(kind="gdpo", advantage="gdpo_pair", clip_grad_share=True)
