"""Off-policy correction (docs/objectives.md#off-policy-correction) against an independent NumPy reference: token / sequence
TIS weights and token / sequence masking through `objective_terms` (values, gradients, denominators,
metrics), the micro-batch invariance of the full train step with a correction on, and the rule that
makes the trainer recompute log π_old."""

import math
import typing

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.objectives import ObjectiveConfig, finalize_metrics, objective_terms, registry
from dapo_jax.objectives import off_policy
from dapo_jax.objectives.config import OffPolicyName

P, G, T = 3, 4, 5
MODES = ("token_tis", "seq_tis", "token_mask", "seq_mask")
EPS_LOW, EPS_HIGH = 0.2, 0.28


def make_inputs(seed=0, spread=0.6):
    """Random log-probs with padding; behaviour = old + noise so ratios land on both sides of [1/2, 2]."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(0, T + 1, size=(P, G))
    lengths[0, 0], lengths[0, 1] = 0, T  # an empty response and a full one
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    old = (rng.normal(size=(P, G, T)) - 1.5).astype(np.float32)
    logp = (old + 0.3 * rng.normal(size=old.shape)).astype(np.float32)
    behaviour = (old + spread * rng.normal(size=old.shape)).astype(np.float32)
    behaviour = np.where(mask > 0, behaviour, 50.0).astype(np.float32)  # padding garbage must not leak
    adv = rng.normal(size=(P, G)).astype(np.float32)
    return dict(logp=logp, old_logp=old, behaviour_logp=behaviour, advantages=adv, mask=mask)


def np_reference(mode, cap, logp, old_logp, behaviour_logp, advantages, mask, loss_agg):
    """(loss, d loss / d logp, denominator, {metric: value}) with explicit float64 loops."""
    logp, old, mu = (np.asarray(x, np.float64) for x in (logp, old_logp, behaviour_logp))
    w = np.ones(mask.shape)
    keep = mask.astype(np.float64).copy()
    ratios, capped = [], []
    for p in range(P):
        for g in range(G):
            valid = mask[p, g] > 0
            if mode.startswith("seq"):
                if not valid.any():
                    continue
                r = math.exp(float(np.sum(old[p, g][valid] - mu[p, g][valid])))
                ratios.append(r)
                capped.append(r > cap)
                if mode == "seq_tis":
                    w[p, g] = min(r, cap)
                elif not 1 / cap <= r <= cap:
                    keep[p, g] = 0
            else:
                for t in np.flatnonzero(valid):
                    r = math.exp(old[p, g, t] - mu[p, g, t])
                    ratios.append(r)
                    capped.append(r > cap)
                    if mode == "token_tis":
                        w[p, g, t] = min(r, cap)
                    elif not 1 / cap <= r <= cap:
                        keep[p, g, t] = 0
    a = np.broadcast_to(advantages[..., None], mask.shape)
    rho = np.exp(logp - old)
    clipped = np.clip(rho, 1 - EPS_LOW, 1 + EPS_HIGH)
    ell = np.maximum(-a * rho, -a * clipped) * w
    active = np.where(a > 0, rho <= 1 + EPS_HIGH, rho >= 1 - EPS_LOW)  # the unclipped branch carries the gradient
    dell = np.where(active, -a * rho, 0.0) * w
    lengths = keep.sum(-1)
    if loss_agg == "token_mean":
        den = keep.sum()
        loss, grad = (ell * keep).sum() / den, dell * keep / den
    else:  # seq_mean_token_mean
        den = float((lengths > 0).sum())
        per = np.where(lengths[..., None] > 0, keep / np.maximum(lengths, 1)[..., None], 0.0)
        loss, grad = (ell * per).sum() / den, dell * per / den
    units = len(ratios)
    masked = units - (keep.sum() if mode == "token_mask" else (lengths > 0).sum() if mode == "seq_mask" else units)
    metrics = {"behaviour_ratio_mean": np.mean(ratios), "behaviour_ratio_max": np.max(ratios),
               "behaviour_ratio_min": np.min(ratios), "behaviour_masked_frac": masked / units,
               "behaviour_capped_frac": np.mean(capped)}
    return loss, grad, den, metrics


def run_terms(cfg, inputs):
    def loss(logp, old, mu):
        s, d, m = objective_terms(cfg, logp=logp, old_logp=old, advantages=inputs["advantages"],
                                  mask=inputs["mask"], behaviour_logp=mu)
        return s / d, (d, m)

    (value, (den, metrics)), grads = jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True)(
        inputs["logp"], inputs["old_logp"], inputs["behaviour_logp"])
    return float(value), [np.asarray(g) for g in grads], float(den), {k: float(v) for k, v in
                                                                       finalize_metrics(metrics).items()}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_matches_numpy_reference(mode, loss_agg):
    inputs = make_inputs(seed=1)
    cfg = ObjectiveConfig(off_policy_correction=mode, off_policy_cap=2.0, eps_low=EPS_LOW, eps_high=EPS_HIGH,
                          loss_agg=loss_agg)
    want, want_grad, want_den, want_metrics = np_reference(mode, 2.0, **inputs, loss_agg=loss_agg)
    got, (g_logp, g_old, g_mu), den, metrics = run_terms(cfg, inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(g_logp, want_grad, rtol=1e-4, atol=1e-7)
    np.testing.assert_allclose(den, want_den, rtol=1e-6)
    # the weight and the mask are constants: no gradient reaches π_old or μ
    np.testing.assert_array_equal(g_old, 0.0)
    np.testing.assert_array_equal(g_mu, 0.0)
    for k, v in want_metrics.items():
        np.testing.assert_allclose(metrics[k], v, rtol=1e-5, atol=1e-7, err_msg=k)
    # the data exercise both sides of the cap (else the test could not see the cap or the mask)
    assert 0 < want_metrics["behaviour_capped_frac"] < 1
    if mode.endswith("mask"):
        assert 0 < want_metrics["behaviour_masked_frac"] < 1


def test_cap_weights_and_denominators_directly():
    """Hand-made ratios: weights are exactly min(r, C); masked tokens / responses leave the denominator."""
    mask = np.array([[[1, 1, 1, 0]], [[1, 1, 0, 0]]], np.float32)  # [P=2, G=1, T=4]
    old = np.zeros(mask.shape, np.float32)
    mu = -np.log(np.array([[[3.0, 1.5, 0.25, 9.0]], [[0.8, 1.1, 9.0, 9.0]]], np.float32))  # ratio π_old/μ
    w, keep, _ = off_policy.token_tis(old, mu, mask, cap=2.0)
    np.testing.assert_allclose(np.asarray(w) * mask, [[[2.0, 1.5, 0.25, 0]], [[0.8, 1.1, 0, 0]]], rtol=1e-6)
    np.testing.assert_array_equal(keep, 1.0)
    _, keep, metrics = off_policy.token_mask(old, mu, mask, cap=2.0)
    np.testing.assert_array_equal(np.asarray(keep) * mask, [[[0, 1, 0, 0]], [[1, 1, 0, 0]]])
    assert [float(x) for x in metrics["behaviour_masked_frac"]] == [2.0, 5.0]
    w, _, _ = off_policy.seq_tis(old, mu, mask, cap=2.0)  # products 1.125 and 0.88
    np.testing.assert_allclose(np.asarray(w)[:, 0, 0], [1.125, 0.88], rtol=1e-5)
    _, keep, _ = off_policy.seq_mask(old, mu * 2, mask, cap=2.0)  # products 1.2656 and 0.7744: both kept
    np.testing.assert_array_equal(np.asarray(keep)[:, 0, 0], [1, 1])
    _, keep, _ = off_policy.seq_mask(old, mu * 4, mask, cap=2.0)  # 1.60 and 0.5997: both kept
    np.testing.assert_array_equal(np.asarray(keep)[:, 0, 0], [1, 1])
    _, keep, metrics = off_policy.seq_mask(old, mu * 8, mask, cap=2.0)  # 2.56 and 0.36: both dropped
    np.testing.assert_array_equal(keep, 0.0)
    cfg = ObjectiveConfig(off_policy_correction="token_mask", loss_agg="token_mean")
    _, den, _ = objective_terms(cfg, logp=old, old_logp=old, advantages=np.ones((2, 1), np.float32), mask=mask,
                                behaviour_logp=mu)
    assert float(den) == 3.0  # 5 valid tokens, 2 masked
    cfg = ObjectiveConfig(off_policy_correction="seq_mask", loss_agg="seq_mean_token_mean")
    s, den, _ = objective_terms(cfg, logp=old, old_logp=old, advantages=np.ones((2, 1), np.float32), mask=mask,
                                behaviour_logp=mu * 8)
    assert float(den) == 0.0 and float(s) == 0.0  # both responses dropped: nothing to train on


def test_on_policy_behaviour_is_a_no_op():
    """μ == π_old (π_old not recomputed): weights 1, nothing masked, the loss of the uncorrected objective."""
    inputs = make_inputs(seed=2)
    inputs["behaviour_logp"] = inputs["old_logp"]
    base = ObjectiveConfig(eps_low=EPS_LOW, eps_high=EPS_HIGH)
    s0, d0, _ = objective_terms(base, **{k: v for k, v in inputs.items() if k != "behaviour_logp"})
    for mode in MODES:
        s, d, m = objective_terms(base.model_copy(update={"off_policy_correction": mode}), **inputs)
        np.testing.assert_allclose([float(s), float(d)], [float(s0), float(d0)], rtol=1e-6)
        f = finalize_metrics(m)
        assert float(f["behaviour_masked_frac"]) == 0.0 and float(f["behaviour_ratio_max"]) == 1.0


def test_config_and_inputs_are_checked():
    with pytest.raises(ValueError, match="off_policy_cap"):
        ObjectiveConfig(off_policy_correction="token_tis", off_policy_cap=1.0)
    with pytest.raises(ValueError, match="off_policy_cap"):
        ObjectiveConfig(off_policy_cap=float("nan"))
    with pytest.raises(ValueError):
        ObjectiveConfig(off_policy_correction="tis")
    inputs = make_inputs()
    cfg = ObjectiveConfig(off_policy_correction="seq_tis")
    assert cfg.needs_behaviour_logp and not ObjectiveConfig().needs_behaviour_logp
    with pytest.raises(ValueError, match="behaviour_logp"):
        objective_terms(cfg, **{k: v for k, v in inputs.items() if k != "behaviour_logp"})
    with pytest.raises(ValueError, match="behaviour_logp"):
        objective_terms(cfg, **{**inputs, "behaviour_logp": inputs["behaviour_logp"][:, :, :2]})
    newer = {"geo_seq_mask", "icepop", "k3_seq_mask"}  # tests/objectives/test_rollout_mismatch.py
    assert set(typing.get_args(OffPolicyName)) == set(registry.OFF_POLICY_CORRECTIONS) == set(MODES) | newer
    tis = registry.load_objective("dapo_tis")
    assert (tis.off_policy_correction, tis.off_policy_cap, tis.eps_high) == ("token_tis", 2.0, 0.28)


def test_recompute_old_logp_follows_precision():
    rule = off_policy.recompute_old_logp
    assert rule(None, sampler_dtype="float32", trainer_dtype="float32", correction=None) is False
    assert rule(None, sampler_dtype="bfloat16", trainer_dtype="float32", correction=None) is True
    assert rule(None, sampler_dtype="float32", trainer_dtype="float32", correction="token_tis") is True
    assert rule(True, sampler_dtype="float32", trainer_dtype="float32", correction=None) is True
    assert rule(False, sampler_dtype="bfloat16", trainer_dtype="float32", correction=None) is False  # explicit wins

    from dapo_jax.training.config.base import ConfigError
    from dapo_jax.training.config.run import load_config

    def resolved(*overrides):
        cfg = load_config(None, list(overrides))
        return cfg.sampler_dtype, cfg.recompute_old_logp

    assert resolved() == ("float32", False)
    assert resolved("rollout.sampler_dtype=bfloat16") == ("bfloat16", True)
    assert resolved("model.dtype=bfloat16") == ("bfloat16", False)  # the sampler follows model.dtype
    assert resolved("rollout.sampler_dtype=bfloat16", "rollout.recompute_old_logp=false") == ("bfloat16", False)
    assert resolved("objective.name=dapo_tis") == ("float32", True)
    assert resolved("rollout.recompute_old_logp=true") == ("float32", True)
    with pytest.raises(ConfigError, match="rollout.recompute_old_logp.*every weight is 1"):
        load_config(None, ["objective.name=dapo_tis", "rollout.recompute_old_logp=false"])


def test_train_step_with_correction_does_not_depend_on_micro_batches():
    """seq_mask drops whole responses (and their tokens from the denominator): the update of the full
    train step is the whole-batch gradient of the NumPy-defined loss for micro_batches 1 and 4, and the
    ratio metrics are the same (the token modes and TIS weights are per token, checked above)."""
    from dapo_jax.models.logprobs import response_logprobs
    from dapo_jax.training.config.sections import OptimSection
    from dapo_jax.training.update.train_step import init_train_state, make_optimizer, make_train_step
    from tests.training.update.test_train_step import make_batch, tiny_model

    batch = make_batch(seed=5, old_shift=0.3)
    rng = np.random.default_rng(7)
    mask = np.asarray(batch.response_mask)
    behaviour = np.asarray(batch.old_logp) + 0.5 * rng.normal(size=mask.shape).astype(np.float32) * mask
    batch = batch._replace(behaviour_logp=jnp.asarray(behaviour, jnp.float32))
    graphdef, params = nnx.split(tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))

    for mode in ("seq_mask",):
        objective = ObjectiveConfig(off_policy_correction=mode, eps_low=EPS_LOW, eps_high=EPS_HIGH)
        got = {}
        for micro in (1, 4):
            step = make_train_step(graphdef, tx, schedule, objective=objective, micro_batches=micro)
            state, metrics = step(init_train_state(nnx.split(tiny_model())[1], tx), batch)
            got[micro] = (float(metrics["grad_norm"]), [np.asarray(x) for x in jax.tree.leaves(state.params)],
                          {k: float(v) for k, v in metrics.items() if k.startswith("behaviour_")})

        # reference: weights / keep from plain NumPy on the whole batch, the surrogate by jax.grad
        old = np.asarray(batch.old_logp, np.float64)
        d = np.where(mask > 0, old - behaviour, 0.0)
        if mode == "seq_mask":
            s = d.sum(-1, keepdims=True)
            w, keep = np.ones(mask.shape), mask * (np.abs(s) <= math.log(2.0))
            assert 0 < keep.sum() < mask.sum()
        else:
            w, keep = np.minimum(np.exp(d), 2.0), mask
            assert (w * mask > 1.999).any()
        w, keep = jnp.asarray(w, jnp.float32), jnp.asarray(keep, jnp.float32)

        def loss(params):
            logp, _ = response_logprobs(nnx.merge(graphdef, params), batch.prompt_ids, batch.prompt_mask,
                                        batch.response_ids, batch.response_mask, temperature=1.0)
            ratio = jnp.exp(logp - batch.old_logp)
            adv = batch.advantages
            ell = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv) * w
            return jnp.sum(ell * keep) / jnp.sum(keep)

        grads = jax.jit(jax.grad(loss))(params)
        for micro, (grad_norm, new_params, metrics) in got.items():
            np.testing.assert_allclose(grad_norm, float(optax.tree.norm(grads)), rtol=1e-4, err_msg=f"{mode} {micro}")
            for a, b in zip(new_params, got[1][1]):
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"{mode} micro_batches={micro}")
            for k, v in metrics.items():  # the ratio metrics combine exactly across micro-batches
                np.testing.assert_allclose(v, got[1][2][k], rtol=1e-6, err_msg=f"{mode} {k} micro_batches={micro}")
        assert set(got[1][2]) >= {"behaviour_ratio_mean", "behaviour_ratio_max", "behaviour_masked_frac"}
