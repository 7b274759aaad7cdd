"""DeepSeek-V3.2's off-policy sequence mask and unbiased KL against float64 NumPy
(docs/objectives_recent.md#deepseek-v32): the one-sided mask, that it drops the policy term only (the KL and
the denominator stay), the KL's gradient."""

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.deepseek_v32 import off_policy_sequence_mask, unbiased_kl
from dapo_jax.objectives.diagnostics import finalize_metrics
from dapo_jax.objectives.kl import k3
from dapo_jax.objectives.loss import objective_terms


def batch(seed, P=3, G=4, T=6):
    rng = np.random.default_rng(seed)
    old = rng.normal(size=(P, G, T)) - 2.0
    logp = old + rng.normal(size=old.shape) * 0.3
    sampler = old + rng.normal(size=old.shape) * 0.6
    ref = old + rng.normal(size=old.shape) * 0.3
    a = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2)
    lengths = rng.integers(0, T + 1, size=(P, G))
    lengths[0, 0] = 0  # an empty response
    mask = (np.arange(T) < lengths[..., None]).astype(np.float64)
    return logp, old, sampler, ref, a, mask


def np_opsm(logp, sampler, a, mask, delta):
    P, G, _ = mask.shape
    keep = np.ones((P, G))
    for p in range(P):
        for g in range(G):
            v = mask[p, g] > 0
            if v.any() and a[p, g, 0] < 0 and np.mean(sampler[p, g, v] - logp[p, g, v]) > delta:
                keep[p, g] = 0.0
    return keep


def test_mask_matches_numpy():
    for seed in range(4):
        logp, _, sampler, _, a, mask = batch(seed)
        keep, metrics = off_policy_sequence_mask(logp, sampler, a, mask, delta=0.1)
        want = np_opsm(logp, sampler, a, mask, 0.1)
        np.testing.assert_array_equal(np.asarray(keep), np.broadcast_to(want[..., None], mask.shape))
        nonempty = mask.sum(-1) > 0
        np.testing.assert_allclose(float(finalize_metrics(metrics)["opsm_masked_frac"]),
                                   (1 - want)[nonempty].mean(), rtol=1e-6)
    assert (want == 0).any() and (want == 1).any()


def test_only_negative_advantages_are_dropped():
    logp, _, sampler, _, a, mask = batch(5)
    keep, _ = off_policy_sequence_mask(logp, sampler + 10.0, np.abs(a), mask, delta=0.0)
    assert np.all(np.asarray(keep) == 1)


def test_objective_drops_the_policy_term_keeps_kl_and_denominator():
    logp, old, sampler, ref, a, mask = batch(6)
    cfg = ObjectiveConfig(opsm_delta=0.1, kl_beta=0.05, loss_agg="seq_mean_token_mean")
    s, d, m = objective_terms(cfg, logp=logp, old_logp=old, advantages=a, mask=mask, ref_logp=ref,
                              behaviour_logp=sampler)
    keep = np_opsm(logp, sampler, a, mask, 0.1)[..., None]
    r = np.exp(logp - old)
    pg = np.maximum(-a * r, -a * np.clip(r, 0.8, 1.28)) * keep
    x = ref - logp
    kl = np.exp(x) - x - 1
    per = ((pg + 0.05 * kl) * mask).sum(-1) / np.maximum(mask.sum(-1), 1)
    nonempty = mask.sum(-1) > 0
    np.testing.assert_allclose(float(s), per[nonempty].sum(), rtol=2e-5)
    assert float(d) == nonempty.sum()
    assert float(finalize_metrics(m)["opsm_masked_frac"]) > 0


def test_without_sampler_logp_the_mask_reads_old_logp():
    logp, old, _, _, a, mask = batch(7)
    cfg = ObjectiveConfig(opsm_delta=0.05)
    assert cfg.needs_behaviour_logp
    _, _, m = objective_terms(cfg, logp=logp, old_logp=old, advantages=a, mask=mask)
    want = np_opsm(logp, old, a, mask, 0.05)
    nonempty = mask.sum(-1) > 0
    np.testing.assert_allclose(float(finalize_metrics(m)["opsm_masked_frac"]), (1 - want)[nonempty].mean(), rtol=1e-6)


def test_unbiased_kl_value_and_gradient():
    logp, old, _, ref, _, _ = batch(8)
    f = lambda lp: unbiased_kl(k3(lp, ref), lp, old)  # noqa: E731
    r = np.exp(logp - old)
    x = ref - logp
    np.testing.assert_allclose(np.asarray(f(logp)), r * (np.exp(x) - x - 1), rtol=2e-5, atol=1e-7)
    g = jax.grad(lambda lp: jnp.sum(f(lp)))(jnp.asarray(logp, jnp.float32))
    np.testing.assert_allclose(np.asarray(g), r * (logp - ref), rtol=1e-4, atol=1e-6)  # ∂(r·k3)/∂logp = r·(logp − ref)


def test_kl_unbiased_in_objective():
    logp, old, _, ref, a, mask = batch(9)
    plain = ObjectiveConfig(kl_beta=0.1)
    unb = ObjectiveConfig(kl_beta=0.1, kl_unbiased=True)
    kw = dict(logp=logp, old_logp=old, advantages=a, mask=mask, ref_logp=ref)
    s0, _, m0 = objective_terms(plain, **kw)
    s1, _, m1 = objective_terms(unb, **kw)
    r = np.exp(logp - old)
    x = ref - logp
    kl = np.exp(x) - x - 1
    np.testing.assert_allclose(float(s1) - float(s0), 0.1 * (((r - 1) * kl) * mask).sum(), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(float(finalize_metrics(m1)["kl"]), (r * kl)[mask > 0].mean(), rtol=1e-5)
