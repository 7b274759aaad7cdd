"""Skywork-OR1's adaptive entropy coefficient: the controller against a NumPy transcription of the rule,
and the loss's entropy term (value and gradient) against NumPy."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives.adaptive_entropy import EntropyControl, adaptive_entropy_update, entropy_controller
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.loss import objective_terms
from dapo_jax.objectives.registry import load_objective


def numpy_controller(entropies, *, c0, target, delta, c_max, c_min=0.0):
    """α_k for k = 1..K+1 from the entropies e_1..e_K, written from docs/objectives_2025.md §6 (the authors'
    code): α_1 = c_0; after step k, c ← clip(c + Δ if e_k < tgt else c − Δ, c_min, c_max), g ← [e_k < tgt],
    α_{k+1} = c·g. float32, as the trainer."""
    c, g, alphas = np.float32(c0), True, []
    for e in entropies:
        alphas.append(np.float32(c) * np.float32(g))
        below = np.float32(e) < np.float32(target)
        c = np.float32(np.clip(np.float32(c) + (np.float32(delta) if below else -np.float32(delta)),
                               np.float32(c_min), np.float32(c_max)))
        g = bool(below)
    alphas.append(np.float32(c) * np.float32(g))
    return alphas


def test_the_controller_follows_the_numpy_rule_up_down_clipped_and_gated():
    # below, below, below (clipped at max), equal (decrements, gate closed), above, above, above (clipped at 0)
    entropies = [0.1, 0.15, 0.05, 0.2, 0.3, 0.9, 0.5, 0.19]
    kw = dict(target=0.2, delta=0.002, c_max=0.005)
    expected = numpy_controller(entropies, c0=0.001, **kw)
    control, got = EntropyControl.start(0.001), []
    for e in entropies:
        got.append(np.float32(control.alpha))
        control = adaptive_entropy_update(control, e, target=0.2, delta=0.002, coef_max=0.005)
        control = EntropyControl(float(control.coef), bool(control.gate))
    got.append(np.float32(control.alpha))
    np.testing.assert_array_equal(np.asarray(got, np.float32), np.asarray(expected, np.float32))
    # hand-checked: 0.001 -> 0.003 -> 0.005 -> 0.005 (max) -> 0.003, gate shut -> ... -> 0 -> 0.002 open
    assert got[3] == np.float32(0.005) and got[4] == 0.0 and got[-2] == 0.0
    assert got[-1] == np.float32(0.002)


def test_the_controller_is_jittable_and_a_nan_entropy_counts_as_above():
    step = jax.jit(lambda c, e: adaptive_entropy_update(c, e, target=0.2, delta=0.1, coef_max=1.0))
    after = step(EntropyControl(jnp.float32(0.5), jnp.bool_(True)), jnp.float32(jnp.nan))
    assert float(after.coef) == pytest.approx(0.4) and not bool(after.gate)


def test_entropy_controller_reads_the_recipe():
    cfg = load_objective("skywork_or1")
    assert (cfg.entropy_target, cfg.entropy_coef_delta, cfg.entropy_coef_max, cfg.entropy_coef_init) == (
        0.2, 1e-4, 0.005, 0.0)
    assert cfg.adaptive_entropy and cfg.needs_entropy and cfg.kl_beta == 0.0
    assert entropy_controller(load_objective("dapo")) is None
    after = entropy_controller(cfg)(EntropyControl.start(0.0), 0.1)
    assert float(after.coef) == pytest.approx(1e-4) and bool(after.gate)


@pytest.mark.parametrize("overrides, match", [
    ({"entropy_coef_delta": 0.01}, "without entropy_target"),
    ({"entropy_target": 0.2, "entropy_coef": 0.01}, "leave the fixed entropy_coef at 0"),
    ({"entropy_target": 0.2, "entropy_coef_init": 0.1, "entropy_coef_max": 0.05}, "entropy_coef_init"),
    ({"entropy_target": -1.0}, "entropy_target"),
    ({"entropy_target": 0.2, "entropy_coef_delta": 0.0}, "entropy_coef_delta"),
    ({"entropy_target": 0.2, "kind": "sft"}, "kind='sft'"),
])
def test_invalid_settings_name_the_key(overrides, match):
    with pytest.raises(ValueError, match=match):
        ObjectiveConfig(**overrides)


def _inputs(seed=0, shape=(2, 3, 5)):
    rng = np.random.default_rng(seed)
    m = (rng.random(shape) < 0.7).astype(np.float32)
    m[..., 0] = 1.0
    logp = np.log(rng.uniform(0.05, 0.9, shape)).astype(np.float32)
    old = (logp + rng.normal(0, 0.05, shape)).astype(np.float32)
    h = rng.uniform(0.1, 3.0, shape).astype(np.float32)
    adv = rng.normal(size=shape[:2]).astype(np.float32)
    return logp, old, h, adv, m


def test_the_loss_subtracts_alpha_times_the_entropy_token_mean_with_its_gradient():
    logp, old, h, adv, m = _inputs()
    cfg = ObjectiveConfig(entropy_target=0.2, eps_low=0.2, eps_high=0.28)
    alpha = 0.003

    def loss(lp, ent, a):
        s, d, _ = objective_terms(cfg, logp=lp, old_logp=old, advantages=adv, mask=m, entropy=ent, entropy_coef=a)
        return s / d

    value, (g_logp, g_h, g_alpha) = jax.value_and_grad(loss, argnums=(0, 1, 2))(
        jnp.asarray(logp), jnp.asarray(h), jnp.float32(alpha))
    # NumPy: ℓ = −min(r A, clip(r, 1−0.2, 1+0.28) A) − α H, token mean over the mask
    r = np.exp(logp.astype(np.float64) - old)
    a = np.broadcast_to(adv[..., None], m.shape)
    pg = -np.minimum(r * a, np.clip(r, 0.8, 1.28) * a)
    expected = np.sum((pg - alpha * h) * m) / m.sum()
    np.testing.assert_allclose(float(value), expected, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(g_h), -alpha * m / m.sum(), rtol=1e-5, atol=1e-9)
    assert float(g_alpha) == 0.0  # α is the controller's, not trained
    # the entropy term does not touch the policy-gradient part's gradient in logp
    off = ObjectiveConfig(eps_low=0.2, eps_high=0.28)
    g_off = jax.grad(lambda lp: (lambda s, d, _: s / d)(*objective_terms(
        off, logp=lp, old_logp=old, advantages=adv, mask=m, entropy=jnp.asarray(h))))(jnp.asarray(logp))
    np.testing.assert_allclose(np.asarray(g_logp), np.asarray(g_off), rtol=1e-6)
    # α = 0 (gate shut): exactly the loss without the term
    s0, d0, _ = objective_terms(cfg, logp=logp, old_logp=old, advantages=adv, mask=m, entropy=h, entropy_coef=0.0)
    s1, d1, _ = objective_terms(off, logp=logp, old_logp=old, advantages=adv, mask=m, entropy=h)
    assert float(s0 / d0) == float(s1 / d1)


def test_the_loss_refuses_a_missing_coefficient():
    logp, old, h, adv, m = _inputs()
    with pytest.raises(ValueError, match="entropy_coef"):
        objective_terms(ObjectiveConfig(entropy_target=0.2), logp=logp, old_logp=old, advantages=adv, mask=m,
                        entropy=h)
