"""EDGE-GRPO's Entropy-Driven Advantage (docs/grpo_variants.md, `entropy_advantage.py`) against an
independent NumPy reference: the scaled advantages (padding, empty responses, zero-spread groups),
the clipped-surrogate loss and its gradient through `objective_terms`, no gradient through the
entropies, the batch-level normaliser (splitting the batch with the whole-batch N gives the whole-batch
loss), and the config rules."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives import ObjectiveConfig, objective_terms, registry
from dapo_jax.objectives.entropy_advantage import entropy_driven_advantages, entropy_normaliser

P, G, T = 3, 4, 5
EPS = 1e-6


def make_inputs(seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=(P, G))
    lengths[0, 0], lengths[0, 1] = 0, T  # an empty response and a full one
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    entropy = rng.uniform(0.1, 3.0, size=(P, G, T)).astype(np.float32)
    entropy = np.where(mask > 0, entropy, np.nan).astype(np.float32)  # padding garbage must not leak
    old = (rng.normal(size=(P, G, T)) - 1.5).astype(np.float32)
    logp = (old + 0.3 * rng.normal(size=old.shape)).astype(np.float32)
    adv = rng.normal(size=(P, G)).astype(np.float32)
    adv[2] = 0.0  # a zero-spread group
    return dict(logp=logp, old_logp=old, advantages=adv, mask=mask, entropy=entropy)


def np_scaled(adv, entropy, mask, norm=None):
    """A_i · N / max(P̄_i, eps) with explicit float64 loops; N over the non-empty responses given."""
    p_bar = np.zeros(adv.shape)
    for i in np.ndindex(adv.shape):
        n = mask[i].sum()
        p_bar[i] = sum(float(entropy[i][t]) for t in range(T) if mask[i][t] > 0) / n if n > 0 else 0.0
    if norm is None:
        nonempty = mask.sum(-1) > 0
        norm = p_bar[nonempty].mean()
    out = np.zeros(adv.shape)
    for i in np.ndindex(adv.shape):
        out[i] = 0.0 if adv[i] == 0 else adv[i] * norm / max(p_bar[i], EPS)
    return out, norm


def np_loss_and_grad(logp, old_logp, adv_seq, mask, eps_low=0.2, eps_high=0.2):
    """Token-mean clipped surrogate and d/d logp, float64."""
    a = np.broadcast_to(adv_seq[..., None], mask.shape).astype(np.float64)
    ratio = np.exp(logp.astype(np.float64) - old_logp)
    unclipped, clipped = -ratio * a, -np.clip(ratio, 1 - eps_low, 1 + eps_high) * a
    ell = np.maximum(unclipped, clipped)
    # the unclipped branch carries -ρ·A; the clipped one is constant outside the range
    inside = (ratio >= 1 - eps_low) & (ratio <= 1 + eps_high)
    grad = np.where((unclipped >= clipped) | inside, -ratio * a, 0.0)
    den = mask.sum()
    return (ell * mask).sum() / den, grad * mask / den


def test_scaled_advantages_match_numpy_with_padding_empty_and_zero_spread():
    x = make_inputs()
    want, _ = np_scaled(x["advantages"], x["entropy"], x["mask"])
    got = entropy_driven_advantages(x["advantages"], x["entropy"], x["mask"])
    chex.assert_trees_all_close(np.asarray(got), want, rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(got)[2] == 0.0)  # zero-spread group: exactly 0
    assert np.asarray(got)[0, 0] == 0.0 or np.isfinite(np.asarray(got)[0, 0])  # empty response: finite
    # token advantages [P, G, T] are scaled by their response's factor
    tok = np.broadcast_to(x["advantages"][..., None], x["mask"].shape) * x["mask"]
    got_tok = entropy_driven_advantages(tok, x["entropy"], x["mask"])
    chex.assert_trees_all_close(np.asarray(got_tok), want[..., None] * x["mask"], rtol=1e-5, atol=1e-6)


def test_zero_entropy_response_is_floored_not_divided_by_zero():
    x = make_inputs(1)
    ent = np.where(x["mask"] > 0, x["entropy"], 0.0).astype(np.float32)
    ent[1, 2] = 0.0  # a fully deterministic response
    got = np.asarray(entropy_driven_advantages(x["advantages"], ent, x["mask"]))
    assert np.all(np.isfinite(got))
    want, _ = np_scaled(x["advantages"], ent, x["mask"])
    chex.assert_trees_all_close(got, want, rtol=1e-5)


def test_edge_grpo_loss_and_gradient_match_numpy():
    x = make_inputs(2)
    cfg = registry.load_objective("edge_grpo")
    assert cfg.entropy_driven_advantage and cfg.needs_entropy

    def loss_fn(logp, entropy):
        s, d, _ = objective_terms(cfg, logp=logp, old_logp=x["old_logp"], advantages=x["advantages"],
                                  mask=x["mask"], entropy=entropy)
        return s / d

    (value, (g_logp, g_ent)) = jax.value_and_grad(loss_fn, argnums=(0, 1))(
        jnp.asarray(x["logp"]), jnp.asarray(x["entropy"]))
    scaled, _ = np_scaled(x["advantages"], x["entropy"], x["mask"])
    want, want_grad = np_loss_and_grad(x["logp"], x["old_logp"], scaled, x["mask"])
    np.testing.assert_allclose(float(value), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g_logp), want_grad, rtol=1e-4, atol=1e-7)
    assert np.all(np.nan_to_num(np.asarray(g_ent), nan=1.0) == 0.0)  # the scale is a constant
    # and it is not the unscaled GRPO loss (the test can tell the two apart)
    plain, _ = np_loss_and_grad(x["logp"], x["old_logp"], x["advantages"].astype(np.float64), x["mask"])
    assert abs(plain - want) > 1e-3


def test_split_batch_with_the_whole_batch_normaliser_gives_the_whole_batch_loss():
    """N is a batch statistic: each part must use the whole batch's N (as the trainer passes it)."""
    x = make_inputs(3)
    cfg = ObjectiveConfig(entropy_driven_advantage=True, eps_low=0.2, eps_high=0.28)
    whole = objective_terms(cfg, **x)
    norm = entropy_normaliser(x["entropy"], x["mask"])
    _, want_norm = np_scaled(x["advantages"], x["entropy"], x["mask"])
    np.testing.assert_allclose(float(norm), want_norm, rtol=1e-6)
    parts = [objective_terms(cfg, **{k: v[sl] for k, v in x.items()}, entropy_norm=norm)
             for sl in (slice(0, 1), slice(1, P))]
    np.testing.assert_allclose(sum(float(p[0]) for p in parts), float(whole[0]), rtol=1e-5)
    np.testing.assert_allclose(sum(float(p[1]) for p in parts), float(whole[1]), rtol=1e-6)
    # each part's own N would give another loss
    own = [objective_terms(cfg, **{k: v[sl] for k, v in x.items()}) for sl in (slice(0, 1), slice(1, P))]
    assert abs(sum(float(p[0]) for p in own) - float(whole[0])) > 1e-4


def test_config_rules():
    with pytest.raises(ValueError, match="entropy is required"):
        x = make_inputs()
        del x["entropy"]
        objective_terms(ObjectiveConfig(entropy_driven_advantage=True), **x)
    with pytest.raises(ValueError, match="gdpo"):
        ObjectiveConfig(kind="gdpo", advantage="gdpo_pair", entropy_driven_advantage=True)
    assert not ObjectiveConfig().needs_entropy
