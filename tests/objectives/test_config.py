"""ObjectiveConfig: defaults, validation naming the field, hashability (static jit arg)."""

import jax
import jax.numpy as jnp
import pydantic
import pytest

from dapo_jax.objectives.config import ObjectiveConfig


def test_defaults_are_dapo():
    c = ObjectiveConfig()
    assert (c.eps_low, c.eps_high, c.loss_agg, c.kl_beta, c.advantage) == (0.2, 0.28, "token_mean", 0.0, "grpo")
    assert (c.reward_correct, c.reward_wrong, c.std_eps, c.std_unbiased) == (1.0, -1.0, 1e-6, True)
    assert not c.needs_reference and not c.needs_entropy


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(policy_loss="gspo", eps_low=4e-4, eps_high=3e-4), "eps_high"),
        (dict(eps_low=0.0), "eps_low"),
        (dict(eps_high=-1.0), "eps_high"),
        (dict(dual_clip_c=1.0), "dual_clip_c"),
        (dict(kl_beta=-0.1), "kl_beta"),
        (dict(advantage="ppo"), "advantage"),
        (dict(policy_loss="sapo2"), "policy_loss"),
        (dict(sapo_tau_neg=0.0), "sapo_tau_neg"),
        (dict(clip_cov_lb=5.0, clip_cov_ub=1.0), "clip_cov_lb"),
        (dict(kl_cov_ratio=0.0), "kl_cov_ratio"),
        (dict(dppo_delta_low=0.0), "dppo_delta_low"),
        (dict(kl_unbiased=True), "kl_unbiased"),
        (dict(off_policy_correction="token_mask", off_policy_cap_low=3.0), "off_policy_cap_low"),
        (dict(off_policy_correction="token_mask", off_policy_batch_normalize=True), "off_policy_batch_normalize"),
        (dict(off_policy_correction="token_tis", off_policy_bypass=True), "off_policy_bypass"),
        (dict(off_policy_bypass=True), "off_policy_bypass"),
        (dict(policy_loss="kl_cov", entropy_driven_advantage=True), "entropy_driven_advantage"),
        (dict(loss_agg="mean"), "loss_agg"),
        (dict(kl_estimator="k4"), "kl_estimator"),
        (dict(kl_in="both"), "kl_in"),
        (dict(high_entropy_quantile=1.5), "high_entropy_quantile"),
        (dict(overlong_buffer=10, max_response_length=5), "overlong_buffer"),
        (dict(std_eps=-1.0), "std_eps"),
        (dict(epsilon=0.2), "epsilon"),
        (dict(multi_reward="normalize_then_sum", advantage="reinforce_pp"), "multi_reward"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(pydantic.ValidationError, match=field):
        ObjectiveConfig(**kwargs)


def test_cispo_may_have_eps_low_above_eps_high():
    c = ObjectiveConfig(policy_loss="cispo", eps_low=1.0, eps_high=0.28)
    assert c.eps_low == 1.0


def test_a_token_clip_may_be_wider_below_than_above():
    import numpy as np

    from dapo_jax.objectives.policy_loss import clipped_surrogate

    c = ObjectiveConfig(eps_low=0.3, eps_high=0.2)
    ratio = np.array([[[0.6, 0.75, 1.15, 1.3]]], np.float32)
    pg, _ = clipped_surrogate(np.log(ratio), np.zeros_like(ratio), np.array([[[-1.0, -1.0, 1.0, 1.0]]],
                                                np.float32), np.ones_like(ratio), eps_low=c.eps_low, eps_high=c.eps_high)
    # ℓ = −min(ρA, clip(ρ, 0.7, 1.2)A): A < 0 clipped below 0.7, A > 0 above 1.2
    np.testing.assert_allclose(np.asarray(pg)[0, 0], [0.7, 0.75, -1.15, -1.2], rtol=1e-6)


def test_frozen_hashable_and_static_under_jit():
    a, b = ObjectiveConfig(kl_beta=0.04), ObjectiveConfig(kl_beta=0.04)
    assert hash(a) == hash(b) and a == b
    assert a.needs_reference
    with pytest.raises(pydantic.ValidationError):
        a.eps_low = 0.1
    c = ObjectiveConfig(reward_weights=[1.0, 0.5])
    assert c.reward_weights == (1.0, 0.5) and isinstance(hash(c), int)
    f = jax.jit(lambda cfg, x: x * cfg.eps_high, static_argnums=0)
    assert float(f(a, jnp.float32(2.0))) == pytest.approx(0.56)
