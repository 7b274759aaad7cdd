"""The trainer's entry points, end to end against an independent NumPy objective, plus invariances."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dapo_jax.objectives import (
    ObjectiveConfig,
    available_objectives,
    combine_metrics,
    compute_advantages,
    dynamic_sampling_keep,
    finalize_metrics,
    load_objective,
    objective_terms,
    shape_rewards,
    token_kl,
)

T = 6
terms_jit = jax.jit(objective_terms, static_argnums=0)


def batch(seed, P=4, G=4):
    rng = np.random.default_rng(seed)
    old = (rng.normal(size=(P, G, T)) - 1.5).astype(np.float32)
    logp = (old + rng.normal(size=old.shape) * 0.4).astype(np.float32)
    ref = (old + rng.normal(size=old.shape) * 0.3).astype(np.float32)
    ent = rng.random((P, G, T)).astype(np.float32) * 3
    lengths = rng.integers(0, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    adv = rng.normal(size=(P, G)).astype(np.float32)
    adv[0] = 0.0  # a zero-spread group
    return dict(logp=logp, old_logp=old, ref_logp=ref, entropy=ent, mask=mask, advantages=adv)


def np_objective(cfg, logp, old_logp, advantages, mask, ref_logp=None, entropy=None):
    """Loss = Σ loss_sum / Σ den written from objectives.md with explicit loops."""
    P, G, _ = mask.shape
    A = np.broadcast_to(advantages[..., None], mask.shape) if advantages.ndim == 2 else advantages
    el, eh = cfg.eps_low, cfg.eps_high
    ell = np.zeros(mask.shape)
    for p in range(P):
        for g in range(G):
            L = mask[p, g].sum()
            s = np.exp(np.clip(np.sum((logp[p, g].astype(np.float64) - old_logp[p, g]) * mask[p, g]) / max(L, 1), -20, 20))
            for t in range(T):
                rho = np.exp(np.clip(float(logp[p, g, t]) - float(old_logp[p, g, t]), -20, 20))
                a = float(A[p, g, t])
                if cfg.policy_loss in ("gspo", "gspo_token"):
                    rho = s
                if cfg.policy_loss == "cispo":
                    v = -min(max(rho, 1 - el), 1 + eh) * a * float(logp[p, g, t])
                else:
                    v = -min(rho * a, min(max(rho, 1 - el), 1 + eh) * a)
                    if cfg.dual_clip_c is not None and a < 0:
                        v = min(v, -cfg.dual_clip_c * a)
                if cfg.kl_beta > 0 and cfg.kl_in == "loss":
                    x = float(logp[p, g, t]) - float(ref_logp[p, g, t])
                    k = {"k1": x, "k2": x * x / 2, "k3": np.exp(-x) + x - 1}[cfg.kl_estimator]
                    if cfg.kl_clamp is not None:
                        k = np.clip(k, -cfg.kl_clamp, cfg.kl_clamp)
                    v += cfg.kl_beta * k
                v -= cfg.entropy_coef * (float(entropy[p, g, t]) if entropy is not None else 0.0)
                ell[p, g, t] = v
    m = mask.copy()
    if cfg.high_entropy_quantile is not None:
        m = m * (entropy >= np.quantile(entropy[mask > 0], 1 - cfg.high_entropy_quantile))
    lengths = m.sum(-1)
    n_resp = (lengths > 0).sum()
    tok = (ell * m).sum()
    if cfg.loss_agg == "token_mean":
        return tok / m.sum()
    if cfg.loss_agg == "seq_mean_token_mean":
        return ((ell * m).sum(-1)[lengths > 0] / lengths[lengths > 0]).sum() / n_resp
    if cfg.loss_agg == "seq_mean_token_sum":
        return tok / n_resp
    if cfg.loss_agg == "group_mean_token_mean":
        group_tokens = m.sum((-2, -1))
        return ((ell * m).sum((-2, -1))[group_tokens > 0] / group_tokens[group_tokens > 0]).sum() / (group_tokens > 0).sum()
    return tok / (n_resp * cfg.max_response_length)


CONFIGS = [load_objective(n, max_response_length=T, overlong_buffer=None) for n in
           ["grpo", "dapo", "dr_grpo", "rloo", "reinforce_pp_baseline", "gspo", "gspo_token", "cispo"]] + [
    ObjectiveConfig(dual_clip_c=3.0, loss_agg="seq_mean_token_sum", entropy_coef=0.01),
    ObjectiveConfig(kl_beta=0.1, kl_estimator="k2", kl_clamp=None, high_entropy_quantile=0.5),
    ObjectiveConfig(kl_beta=0.1, kl_estimator="k1", eps_low=0.1, eps_high=0.1),
    ObjectiveConfig(loss_agg="group_mean_token_mean", kl_beta=0.05, eps_high=0.28),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: c.name + "_" + c.policy_loss + "_" + c.loss_agg)
def test_objective_matches_numpy(cfg):
    b = batch(0)
    kw = {k: b[k] for k in ("logp", "old_logp", "advantages", "mask")}
    kw["ref_logp"] = b["ref_logp"] if cfg.needs_reference else None
    kw["entropy"] = b["entropy"] if cfg.needs_entropy else None
    s, d, metrics = terms_jit(cfg, **kw)
    np.testing.assert_allclose(float(s) / float(d), np_objective(cfg, **kw), rtol=2e-5, atol=1e-6)
    out = finalize_metrics(metrics)
    assert all(np.isfinite(v) for v in out.values())
    np.testing.assert_allclose(out["zero_adv_group_frac"], 1 / 4)


def test_gradient_matches_finite_differences():
    cfg = ObjectiveConfig(kl_beta=0.04, dual_clip_c=3.0, entropy_coef=0.0)
    b = batch(1, P=2, G=3)
    f = lambda lp: (lambda s, d, _: s / d)(*objective_terms(cfg, logp=lp, old_logp=b["old_logp"], advantages=b["advantages"], mask=b["mask"], ref_logp=b["ref_logp"]))
    g = np.asarray(jax.grad(f)(jnp.asarray(b["logp"], jnp.float32)))
    base = b["logp"].astype(np.float64)
    h = 1e-3
    rng = np.random.default_rng(0)
    for idx in [tuple(rng.integers(0, n) for n in base.shape) for _ in range(12)]:
        up, dn = base.copy(), base.copy()
        up[idx] += h
        dn[idx] -= h
        fd = (np_objective(cfg, up, b["old_logp"], b["advantages"], b["mask"], b["ref_logp"])
              - np_objective(cfg, dn, b["old_logp"], b["advantages"], b["mask"], b["ref_logp"])) / (2 * h)
        np.testing.assert_allclose(g[idx], fd, rtol=1e-3, atol=1e-5)
    assert np.all(g[b["mask"] == 0] == 0.0)


def test_beta_zero_needs_no_reference_and_beta_positive_requires_it():
    b = batch(2)
    kw = {k: b[k] for k in ("logp", "old_logp", "advantages", "mask")}
    cfg = load_objective("dapo")
    s, d, m = objective_terms(cfg, **kw)
    assert "kl" not in m and np.isfinite(float(s))
    with pytest.raises(ValueError, match="ref_logp"):
        objective_terms(load_objective("grpo"), **kw)
    with pytest.raises(ValueError, match="entropy"):
        objective_terms(ObjectiveConfig(entropy_coef=0.01), **kw)
    with pytest.raises(ValueError, match="old_logp"):
        objective_terms(cfg, **{**kw, "old_logp": b["old_logp"][:, :, :-1]})
    with pytest.raises(ValueError, match="advantages"):
        objective_terms(cfg, **{**kw, "advantages": b["advantages"][:2]})


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "group_mean_token_mean",
                                 "constant_norm"])
def test_micro_batch_invariance_loss_gradient_and_metrics(agg):
    cfg = ObjectiveConfig(loss_agg=agg, max_response_length=T, kl_beta=0.02, dual_clip_c=3.0)
    b = batch(3, P=6, G=4)

    def pairs(lp, sl):
        s, d, m = objective_terms(cfg, logp=lp[sl], old_logp=b["old_logp"][sl], advantages=b["advantages"][sl],
                            mask=b["mask"][sl], ref_logp=b["ref_logp"][sl])
        return s, d, m

    def whole(lp):
        s, d, _ = pairs(lp, slice(None))
        return s / d

    def split(lp, k):
        out = [pairs(lp, slice(i * 6 // k, (i + 1) * 6 // k)) for i in range(k)]
        return sum(o[0] for o in out) / sum(o[1] for o in out)

    lp = jnp.asarray(b["logp"])
    vg_whole = jax.jit(jax.value_and_grad(whole))(lp)
    for k in (2, 3):
        vg_split = jax.jit(jax.value_and_grad(split), static_argnums=1)(lp, k)
        np.testing.assert_allclose(float(vg_split[0]), float(vg_whole[0]), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(vg_split[1]), np.asarray(vg_whole[1]), rtol=1e-5, atol=1e-8)
    m_whole = finalize_metrics(jax.jit(lambda x: pairs(x, slice(None))[2])(lp))
    m_split = finalize_metrics(combine_metrics(jax.jit(lambda x: [pairs(x, slice(0, 2))[2], pairs(x, slice(2, 6))[2]])(lp)))
    for key in m_whole:
        np.testing.assert_allclose(m_split[key], m_whole[key], rtol=1e-5, atol=1e-7, err_msg=key)


def test_all_truncated_and_filtered_gives_zero_pair_no_nan():
    cfg = load_objective("dapo", overlong_filtering=True, max_response_length=T, overlong_buffer=2)
    b = batch(4)
    rewards = np.ones((4, 4), np.float32)
    r, mask = shape_rewards(cfg, rewards, lengths=np.full((4, 4), T), truncated=np.ones((4, 4), bool), mask=b["mask"])
    assert float(jnp.sum(mask)) == 0.0
    np.testing.assert_allclose(np.asarray(r), 1.0 - 1.0)  # L = L_max sits at the end of the band: -1
    kw = dict(logp=b["logp"], old_logp=b["old_logp"], advantages=b["advantages"], mask=mask)
    s, d, m = terms_jit(cfg, **kw)
    assert float(s) == 0.0 and float(d) == 0.0
    g = jax.grad(lambda lp: terms_jit(cfg, **{**kw, "logp": lp})[0])(jnp.asarray(b["logp"]))
    assert np.all(np.asarray(g) == 0.0)
    assert all(v == 0.0 for v in finalize_metrics(m).values())


def test_extreme_log_ratios_no_nan():
    b = batch(5)
    lp = np.where(np.random.default_rng(0).random(b["logp"].shape) < 0.5, 1e3, -1e3).astype(np.float32)
    for name in ("dapo", "grpo", "gspo", "cispo"):
        cfg = load_objective(name, dual_clip_c=3.0) if name != "cispo" else load_objective(name)
        kw = dict(logp=lp, old_logp=b["old_logp"], advantages=b["advantages"], mask=b["mask"], ref_logp=b["ref_logp"])
        (s, (d, m)), g = jax.jit(jax.value_and_grad(
            lambda x: (lambda s_, d_, m_: (s_, (d_, m_)))(*objective_terms(cfg, **{**kw, "logp": x})), has_aux=True))(jnp.asarray(lp))
        assert np.isfinite(float(s)) and np.all(np.isfinite(np.asarray(g))), name
        assert all(np.isfinite(v) for v in finalize_metrics(m).values()), name


def test_sharded_on_mesh_matches_single_device():
    mesh = jax.make_mesh((2, 4), ("p", "g"), axis_types=(jax.sharding.AxisType.Auto,) * 2)
    cfg = load_objective("grpo")
    b = batch(6, P=4, G=8)
    kw = dict(logp=b["logp"], old_logp=b["old_logp"], advantages=b["advantages"], mask=b["mask"], ref_logp=b["ref_logp"])
    want_s, want_d, want_m = terms_jit(cfg, **kw)
    want_g = jax.grad(lambda lp: terms_jit(cfg, **{**kw, "logp": lp})[0])(jnp.asarray(b["logp"]))
    for spec in (jax.sharding.PartitionSpec("p", "g"), jax.sharding.PartitionSpec(None, ("p", "g"))):
        put = lambda x: jax.device_put(x, jax.sharding.NamedSharding(mesh, spec))
        skw = {k: put(v) for k, v in kw.items()}
        s, d, m = terms_jit(cfg, **skw)
        np.testing.assert_allclose(float(s), float(want_s), rtol=1e-6)
        assert float(d) == float(want_d)
        g = jax.jit(jax.grad(lambda lp: objective_terms(cfg, **{**skw, "logp": lp})[0]))(skw["logp"])
        np.testing.assert_allclose(np.asarray(g), np.asarray(want_g), rtol=1e-6, atol=1e-9)
        got_m, exp_m = finalize_metrics(m), finalize_metrics(want_m)
        for key in exp_m:
            np.testing.assert_allclose(float(got_m[key]), float(exp_m[key]), rtol=1e-6, atol=1e-9, err_msg=key)
        rewards = put(np.random.default_rng(0).integers(0, 2, (4, 8)).astype(np.float32))
        adv = jax.jit(compute_advantages, static_argnums=0)(cfg, rewards, skw["mask"])
        np.testing.assert_allclose(np.asarray(adv), np.asarray(compute_advantages(cfg, np.asarray(rewards), b["mask"])), atol=1e-6)


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**31 - 1), st.sampled_from(["dapo", "grpo", "dr_grpo", "gspo", "cispo"]))
def test_property_loss_pair_invariant_to_permuting_responses(seed, name):
    cfg = load_objective(name, max_response_length=T, overlong_buffer=None)
    b = batch(seed % 1000, P=2, G=4)
    perm = np.random.default_rng(seed).permutation(4)
    kw = dict(logp=b["logp"], old_logp=b["old_logp"], advantages=b["advantages"], mask=b["mask"], ref_logp=b["ref_logp"])
    s, d, _ = terms_jit(cfg, **kw)
    sp, dp, _ = terms_jit(cfg, **{k: v[:, perm] for k, v in kw.items()})
    np.testing.assert_allclose(float(sp), float(s), rtol=1e-5, atol=1e-6)
    assert float(dp) == float(d)


def test_compute_advantages_paths():
    b = batch(7)
    rng = np.random.default_rng(1)
    rewards = rng.integers(0, 2, (4, 4)).astype(np.float32)
    grpo = compute_advantages(load_objective("grpo"), rewards, b["mask"])
    assert grpo.shape == (4, 4)
    np.testing.assert_allclose(np.asarray(grpo).sum(1), 0.0, atol=1e-5)
    # REINFORCE++ with the KL in the reward: kl required, and it changes the advantages
    cfg = load_objective("reinforce_pp")
    with pytest.raises(ValueError, match="kl"):
        compute_advantages(cfg, rewards, b["mask"])
    kl = token_kl(cfg, b["old_logp"], b["ref_logp"])
    a_kl = compute_advantages(cfg, rewards, b["mask"], kl=kl)
    a_0 = compute_advantages(cfg.model_copy(update={"kl_beta": 0.0}), rewards, b["mask"])
    assert a_kl.shape == b["mask"].shape and not np.allclose(np.asarray(a_kl), np.asarray(a_0))
    # beta = 0: kl ignored even when given
    np.testing.assert_array_equal(np.asarray(compute_advantages(load_objective("dapo"), rewards, b["mask"], kl=kl)),
                                  np.asarray(compute_advantages(load_objective("dapo"), rewards, b["mask"])))
    # K rewards: weighted sum, then the estimator
    multi = np.stack([rewards, rng.random((4, 4)).astype(np.float32)], -1)
    cfg_sum = ObjectiveConfig(reward_weights=(1.0, 0.5))
    np.testing.assert_allclose(np.asarray(compute_advantages(cfg_sum, multi, b["mask"])),
                               np.asarray(compute_advantages(cfg_sum, multi @ np.array([1.0, 0.5], np.float32), b["mask"])), atol=1e-6)
    gdpo = compute_advantages(ObjectiveConfig(multi_reward="normalize_then_sum"), multi, b["mask"])
    assert gdpo.shape == (4, 4) and np.all(np.isfinite(np.asarray(gdpo)))


def test_shape_rewards_dapo_penalty_and_dynamic_sampling():
    cfg = load_objective("dapo", max_response_length=20, overlong_buffer=8)
    rewards = np.array([[1.0, -1.0, 1.0, 1.0]], np.float32)
    lengths = np.array([[5, 16, 20, 12]])
    mask = np.ones((1, 4, 20), np.float32)
    r, m = shape_rewards(cfg, rewards, lengths, np.array([[0, 0, 1, 0]], bool), mask)
    np.testing.assert_allclose(np.asarray(r), [[1.0, -1.5, 0.0, 1.0]])
    assert m is mask  # filtering off in DAPO's recipe
    keep, counts = dynamic_sampling_keep(cfg, correct=np.array([[1, 0, 1, 1], [1, 1, 1, 1]]))
    np.testing.assert_array_equal(np.asarray(keep), [True, False])
    assert int(counts["all_correct"]) == 1
    with pytest.raises(ValueError, match="max_response_length"):
        shape_rewards(load_objective("dapo"), rewards, lengths, np.zeros((1, 4), bool), mask)
    with pytest.raises(ValueError, match="rewards"):
        dynamic_sampling_keep(cfg.model_copy(update={"dynamic_sampling_metric": "reward"}), correct=np.ones((1, 4)))


def test_every_recipe_runs_under_jit():
    b = batch(8)
    for name in available_objectives():
        cfg = load_objective(name, max_response_length=T, overlong_buffer=None)
        rewards = np.random.default_rng(0).normal(size=(4, 4)).astype(np.float32)
        kl = token_kl(cfg, b["old_logp"], b["ref_logp"])
        if cfg.uses_critic:  # PPO / VAPO: advantages from a critic's values (training/update/critic.py supplies them)
            from dapo_jax.objectives.gae import advantages_and_targets

            adv, _ = advantages_and_targets(cfg, rewards, b["mask"], np.zeros(b["mask"].shape, np.float32), kl)
        else:
            adv = compute_advantages(cfg, rewards, b["mask"], kl=kl)
        s, d, _ = terms_jit(cfg, logp=b["logp"], old_logp=b["old_logp"], advantages=adv, mask=b["mask"],
                            ref_logp=b["ref_logp"] if cfg.needs_reference else None,
                            # μ near π_old (near π_θ in bypass mode): the narrow sequence masks keep some responses
                            behaviour_logp=(b["logp"] if cfg.off_policy_bypass else b["old_logp"] + 1e-3 * b["ref_logp"])
                            if cfg.needs_behaviour_logp else None,
                            entropy=b["entropy"] if cfg.needs_entropy else None,
                            **({"nll_weight": b["mask"] * 0.1} if cfg.nll_coef > 0 else {}),
                            # Skywork-OR1: the step's adaptive coefficient α_k comes from the run's controller
                            **({"entropy_coef": np.float32(cfg.entropy_coef_init)} if cfg.adaptive_entropy else {}))
        assert np.isfinite(float(s)) and float(d) > 0, name
