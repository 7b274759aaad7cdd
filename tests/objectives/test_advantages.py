"""Advantage estimators against plain NumPy loops (docs/objectives.md#advantages)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_jax.objectives import advantages as adv


def rand_batch(seed, P=3, G=4, T=6, levels=None):
    rng = np.random.default_rng(seed)
    if levels is None:
        r = rng.normal(size=(P, G)).astype(np.float32)
    else:
        r = rng.choice(levels, size=(P, G)).astype(np.float32)
    lengths = rng.integers(0, T + 1, size=(P, G))
    mask = (np.arange(T)[None, None] < lengths[..., None]).astype(np.float32)
    return r, mask


def np_group(r, eps, unbiased, kind):
    P, G = r.shape
    out = np.zeros((P, G))
    for p in range(P):
        x = r[p].astype(np.float64)
        if np.all(x == x[0]):
            continue
        mean = x.mean()
        std = x.std(ddof=1 if unbiased else 0)
        for g in range(G):
            if kind == "grpo":
                out[p, g] = (x[g] - mean) / (std + eps)
            elif kind == "dr_grpo":
                out[p, g] = x[g] - mean
            elif kind == "rloo":
                out[p, g] = x[g] - (x.sum() - x[g]) / (G - 1)
    return out


@pytest.mark.parametrize("kind", ["grpo", "dr_grpo", "rloo"])
@pytest.mark.parametrize("unbiased", [True, False])
@pytest.mark.parametrize("eps", [1e-6, 1e-4, 0.0])
def test_group_estimators_match_numpy(kind, unbiased, eps):
    for seed in range(3):
        r, _ = rand_batch(seed, levels=[0.0, 1.0, 0.5] if seed == 2 else None)
        got = getattr(adv, kind)(jnp.asarray(r), eps=eps, unbiased=unbiased)
        np.testing.assert_allclose(np.asarray(got), np_group(r, eps, unbiased, kind), rtol=1e-6, atol=1e-6)


def test_grpo_hand_case():
    r = jnp.array([[1.0, 0.0, 0.0, 1.0]])
    # mean 0.5, unbiased std sqrt(1/3) -> ±0.5*sqrt(3)
    a = adv.grpo(r, eps=0.0)
    np.testing.assert_allclose(np.asarray(a), [[0.8660254, -0.8660254, -0.8660254, 0.8660254]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(adv.rloo(r)), [[2 / 3, -2 / 3, -2 / 3, 2 / 3]], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(adv.dr_grpo(r)), [[0.5, -0.5, -0.5, 0.5]])


@pytest.mark.parametrize("name", ["grpo", "dr_grpo", "rloo", "batch_norm", "reinforce_pp_baseline"])
@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-4])
def test_zero_spread_group_is_exactly_zero(name, eps):
    # 0.1 * 3 / 3 != 0.1 in float: a naive r - mean would leave ~1e-9 (and /0 -> NaN at eps = 0).
    r = jnp.array([[0.1, 0.1, 0.1], [1.0, -1.0, 1.0], [-1.0, -1.0, -1.0]], jnp.float32)
    mask = jnp.ones((3, 3, 4))
    a = np.asarray(getattr(adv, name)(r, mask=mask, eps=eps))
    assert np.all(np.isfinite(a))
    assert np.all(a[0] == 0.0) and np.all(a[2] == 0.0)
    assert np.any(a[1] != 0.0)


def test_g2_and_valid_mask():
    r = jnp.array([[1.0, -1.0], [3.0, 3.0]])
    a = np.asarray(adv.grpo(r, eps=0.0))
    # G = 2: unbiased std of {1, -1} is sqrt(2): A = ±1/sqrt(2)
    np.testing.assert_allclose(a, [[1 / np.sqrt(2), -1 / np.sqrt(2)], [0.0, 0.0]], rtol=1e-6)
    # the invalid response is left out of the stats and gets 0
    r3 = jnp.array([[1.0, -1.0, 100.0]])
    a3 = np.asarray(adv.grpo(r3, valid=jnp.array([[1, 1, 0]]), eps=0.0))
    np.testing.assert_allclose(a3, [[1 / np.sqrt(2), -1 / np.sqrt(2), 0.0]], rtol=1e-6)
    # one valid response: nothing to compare against, 0
    a1 = np.asarray(adv.rloo(r3, valid=jnp.array([[0, 1, 0]])))
    assert np.all(a1 == 0.0)


def test_batch_norm_matches_numpy():
    r, _ = rand_batch(5, P=4, G=3)
    got = np.asarray(adv.batch_norm(jnp.asarray(r), eps=1e-4))
    want = (r - r.mean(1, keepdims=True)) / (r.astype(np.float64).std(ddof=1) + 1e-4)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def np_whiten(x, m, eps, unbiased=True):
    vals = x[m > 0].astype(np.float64)
    mean, std = vals.mean(), vals.std(ddof=1 if unbiased else 0)
    return (x - mean) / (std + eps) * m


def test_reinforce_pp_matches_numpy_loops():
    r, mask = rand_batch(7, P=2, G=3, T=5)
    mask[0, 0] = 0  # a fully masked response
    rng = np.random.default_rng(1)
    klp = rng.normal(size=mask.shape).astype(np.float32) * 0.1
    P, G, T = mask.shape
    s = np.zeros_like(mask, dtype=np.float64)
    for p in range(P):
        for g in range(G):
            valid = np.nonzero(mask[p, g])[0]
            for t in valid:
                s[p, g, t] = -klp[p, g, t]
            if len(valid):
                s[p, g, valid[-1]] += r[p, g]
    R = np.zeros_like(s)
    for p in range(P):
        for g in range(G):
            acc = 0.0
            for t in reversed(range(T)):
                acc += s[p, g, t] * mask[p, g, t]
                R[p, g, t] = acc * mask[p, g, t]
    want = np_whiten(R, mask, 1e-6)
    got = adv.reinforce_pp(jnp.asarray(r), mask=jnp.asarray(mask), kl_penalty=jnp.asarray(klp))
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-5, atol=1e-5)
    assert np.all(np.asarray(got)[0, 0] == 0.0)


def test_reinforce_pp_without_kl_hand_case():
    # one prompt, two responses, lengths 2 and 1, r = (1, 0): returns (1, 1 | 0); whitened over 3 tokens
    mask = jnp.array([[[1.0, 1.0], [1.0, 0.0]]])
    got = np.asarray(adv.reinforce_pp(jnp.array([[1.0, 0.0]]), mask=mask, eps=0.0))
    mean, std = 2 / 3, np.std([1, 1, 0], ddof=1)
    want = np.array([[[(1 - mean) / std, (1 - mean) / std], [(0 - mean) / std, 0.0]]])
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_reinforce_pp_baseline_matches_numpy():
    r, mask = rand_batch(11, P=3, G=4, T=5, levels=[0.0, 1.0])
    got = np.asarray(adv.reinforce_pp_baseline(jnp.asarray(r), mask=jnp.asarray(mask)))
    centred = r - r.mean(1, keepdims=True)
    want = np_whiten(np.broadcast_to(centred[..., None], mask.shape), mask, 1e-6)
    zero = np.all(r == r[:, :1], axis=1)
    want[zero] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_sequence_estimator_with_kl_penalty_subtracts_its_sum():
    r, mask = rand_batch(3)
    klp = np.full(mask.shape, 0.01, np.float32)
    got = adv.dr_grpo(jnp.asarray(r), mask=jnp.asarray(mask), kl_penalty=jnp.asarray(klp))
    r_eff = r - (klp * mask).sum(-1)
    np.testing.assert_allclose(np.asarray(got), np_group(r_eff, 0, True, "dr_grpo"), atol=1e-6)
    with pytest.raises(ValueError, match="mask"):
        adv.grpo(jnp.asarray(r), kl_penalty=jnp.asarray(klp))


def test_combine_rewards_sum_and_normalize_then_sum():
    rng = np.random.default_rng(0)
    r = rng.integers(0, 3, size=(4, 3, 2)).astype(np.float32)
    r[0] = 1.0  # a zero-spread group for both rewards
    w = (1.0, 0.5)
    np.testing.assert_allclose(np.asarray(adv.combine_rewards(jnp.asarray(r), weights=w)), r @ np.array(w), rtol=1e-6)
    got = np.asarray(adv.combine_rewards(jnp.asarray(r), weights=w, mode="normalize_then_sum", eps=1e-4))
    per = np.stack([np_group(r[..., k], 1e-4, True, "grpo") for k in range(2)], -1)
    s = per @ np.array(w)
    want = (s - s.mean()) / (s.std(ddof=1) + 1e-4)
    want[np.all(s == s[:, :1], axis=1)] = 0.0
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert np.all(got[0] == 0.0)
    with pytest.raises(ValueError, match="reward_weights"):
        adv.combine_rewards(jnp.asarray(r), weights=(1.0, 2.0, 3.0))


def test_bf16_inputs():
    r, mask = rand_batch(4, levels=[0.0, 0.25, 1.0])
    rb = jnp.asarray(r, jnp.bfloat16)  # these levels are exact in bf16
    a = adv.grpo(rb)
    assert a.dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(a), np_group(r, 1e-6, True, "grpo"), rtol=1e-6, atol=1e-6)
    a_rand = adv.grpo(jnp.asarray(rand_batch(5)[0], jnp.bfloat16))
    np.testing.assert_allclose(np.asarray(a_rand), np_group(rand_batch(5)[0], 1e-6, True, "grpo"), atol=3e-2)


def test_to_tokens():
    mask = jnp.array([[[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    np.testing.assert_array_equal(np.asarray(adv.to_tokens(jnp.array([[2.0, 3.0]]), mask)),
                                  [[[2.0, 2.0, 0.0], [0.0, 0.0, 0.0]]])


def test_sharded_matches_single_device():
    mesh = jax.make_mesh((2, 4), ("p", "g"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    r, mask = rand_batch(9, P=4, G=8, T=6)
    spec2 = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("p", "g"))
    spec3 = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("p", "g", None))
    rs, ms = jax.device_put(r, spec2), jax.device_put(mask, spec3)
    for fn in (adv.grpo, adv.rloo, adv.batch_norm, adv.reinforce_pp, adv.reinforce_pp_baseline):
        want = np.asarray(fn(jnp.asarray(r), mask=jnp.asarray(mask)))
        got = np.asarray(jax.jit(lambda a, b: fn(a, mask=b))(rs, ms))
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 4), st.integers(2, 6), st.integers(0, 2**31 - 1), st.sampled_from(["grpo", "dr_grpo", "rloo"]))
def test_property_zero_sum_in_group(P, G, seed, name):
    rng = np.random.default_rng(seed)
    r = rng.choice([0.0, 1.0, -1.0, 0.5], size=(P, G)).astype(np.float32)
    a = np.asarray(getattr(adv, name)(jnp.asarray(r)))
    np.testing.assert_allclose(a.sum(axis=1), 0.0, atol=1e-5)
    assert np.all(np.isfinite(a))
