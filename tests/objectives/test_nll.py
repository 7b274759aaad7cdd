"""VAPO's positive-example NLL term: L_PPO + μ·L_NLL over the correct responses of each optimizer batch,
exact however a batch is split into micro-batches (docs/objectives.md#critic-ppo-vapo, item 4)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.loss import objective_terms
from dapo_jax.objectives.nll import nll_weights

P, G, T = 8, 3, 5
MU = 0.1


def case(seed=0, loss_agg="token_mean"):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    correct = rng.random((P, G)) < 0.4
    correct[4:6] = False  # one optimizer batch below has a prompt pair with no correct response at all
    logp = (-rng.random((P, G, T)) * 3).astype(np.float32)
    old = (logp + rng.normal(size=logp.shape) * 0.2).astype(np.float32)
    adv = rng.normal(size=(P, G)).astype(np.float32)
    cfg = ObjectiveConfig(loss_agg=loss_agg, nll_coef=MU, max_response_length=T)
    return cfg, mask, correct, logp, old, adv


def den_per_prompt(cfg, mask):
    from dapo_jax.objectives.registry import AGGREGATIONS

    agg = AGGREGATIONS[cfg.loss_agg]
    return jnp.stack([agg(jnp.zeros_like(mask[p:p + 1]), mask[p:p + 1], max_response_length=T)[1] for p in range(P)])


def np_nll(logp, mask, correct):
    m = mask * correct[..., None]
    return -(logp * m).sum() / m.sum() if m.sum() > 0 else 0.0


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batches_give_ppo_plus_mu_nll_per_optimizer_batch(loss_agg):
    cfg, mask, correct, logp, old, adv = case(loss_agg=loss_agg)
    batch_ids = np.repeat(np.arange(2), P // 2)  # two optimizer batches of 4 prompts
    w = nll_weights(correct, mask, batch_ids, den_per_prompt(cfg, mask), coef=MU, num_batches=2)
    chex.assert_shape(w, (P, G, T))
    plain = cfg.model_copy(update={"nll_coef": 0.0})
    for j in range(2):
        sl = slice(4 * j, 4 * j + 4)

        def split_loss(lp, parts):  # accumulated over micro-batches, divided once
            tot = den = 0.0
            for q in parts:
                s, d, _ = objective_terms(cfg, logp=lp[q], old_logp=old[sl][q], advantages=adv[sl][q],
                                          mask=mask[sl][q], nll_weight=w[sl][q])
                tot, den = tot + s, den + d
            return tot / den

        def reference(lp):
            s, d, _ = objective_terms(plain, logp=lp, old_logp=old[sl], advantages=adv[sl], mask=mask[sl])
            m = jnp.asarray(mask[sl] * correct[sl][..., None])
            nll = -jnp.sum(lp * m) / jnp.maximum(jnp.sum(m), 1.0)
            return s / d + MU * nll

        whole = [slice(0, 4)]
        micro = [slice(i, i + 1) for i in range(4)]
        want = float(reference(jnp.asarray(logp[sl])))
        ppo_only = objective_terms(plain, logp=logp[sl], old_logp=old[sl], advantages=adv[sl], mask=mask[sl])
        np.testing.assert_allclose(want - float(ppo_only[0] / ppo_only[1]), MU * np_nll(logp[sl], mask[sl], correct[sl]),
                                   rtol=1e-5, atol=1e-7)
        for parts in (whole, micro):
            np.testing.assert_allclose(float(split_loss(jnp.asarray(logp[sl]), parts)), want, rtol=1e-5, atol=1e-6)
            g = jax.grad(split_loss)(jnp.asarray(logp[sl]), parts)
            chex.assert_trees_all_close(g, jax.grad(reference)(jnp.asarray(logp[sl])), rtol=1e-5, atol=1e-7)


def test_no_correct_response_means_no_nll_term():
    cfg, mask, correct, logp, old, adv = case(1)
    w = nll_weights(np.zeros_like(correct), mask, np.zeros(P, np.int32), den_per_prompt(cfg, mask), coef=MU,
                    num_batches=1)
    assert np.all(np.asarray(w) == 0.0)
    s, d, metrics = objective_terms(cfg, logp=logp, old_logp=old, advantages=adv, mask=mask, nll_weight=w)
    s0, d0, _ = objective_terms(cfg.model_copy(update={"nll_coef": 0.0}), logp=logp, old_logp=old, advantages=adv,
                                mask=mask)
    np.testing.assert_allclose(float(s), float(s0), rtol=1e-6)
    assert float(metrics["nll"][1]) == 0.0


def test_nll_metric_and_missing_weights():
    cfg, mask, correct, logp, old, adv = case(2)
    w = nll_weights(correct, mask, np.zeros(P, np.int32), den_per_prompt(cfg, mask), coef=MU, num_batches=1)
    _, _, metrics = objective_terms(cfg, logp=logp, old_logp=old, advantages=adv, mask=mask, nll_weight=w)
    np.testing.assert_allclose(float(metrics["nll"][0] / metrics["nll"][1]), np_nll(logp, mask, correct), rtol=1e-5)
    with pytest.raises(ValueError, match="nll_weight"):
        objective_terms(cfg, logp=logp, old_logp=old, advantages=adv, mask=mask)


def test_config_refuses_nll_with_a_parameter_dependent_denominator():
    with pytest.raises(ValueError, match="nll_coef"):
        ObjectiveConfig(nll_coef=0.1, high_entropy_quantile=0.2)
    with pytest.raises(ValueError, match="needs a critic"):
        ObjectiveConfig(value_pretrain_steps=3)
