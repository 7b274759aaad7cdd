"""GDPO (group DPO, docs/objectives.md#gfpo-gdpo) against a plain-NumPy reference: the pair, the loss, its gradient,
ties, zero-spread groups, padding, the metrics, and that the train step does not depend on micro_batches."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.objectives import combine_metrics, compute_advantages, finalize_metrics, load_objective, objective_terms
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.gdpo import gdpo_pair
from dapo_jax.objectives.registry import ADVANTAGES, OBJECTIVE_KINDS

P, G, T = 5, 4, 6
BETA = 0.1


def np_pair(rewards, mask):
    """(index of y+, index of y-) per group over the responses with a token, or None without spread."""
    out = []
    for p in range(rewards.shape[0]):
        idx = [g for g in range(rewards.shape[1]) if mask[p, g].sum() > 0]
        r = [float(rewards[p, g]) for g in idx]
        if len(idx) < 2 or max(r) == min(r):
            out.append(None)
            continue
        out.append((idx[r.index(max(r))], idx[r.index(min(r))]))  # list.index: the first among ties
    return out


def np_gdpo(rewards, logp, ref, mask, beta=BETA):
    """Mean over groups with a pair of -log σ(β·margin), its gradient w.r.t. logp, and the margins."""
    pairs = np_pair(rewards, mask)
    used = [p for p, pr in enumerate(pairs) if pr is not None]
    grad = np.zeros(logp.shape)
    losses, margins = [], []
    for p in used:
        hi, lo = pairs[p]
        ell = lambda g: sum(float(logp[p, g, t]) - float(ref[p, g, t]) for t in range(T) if mask[p, g, t] > 0)  # noqa: E731
        z = beta * (ell(hi) - ell(lo))
        losses.append(np.log1p(np.exp(-z)))
        margins.append(z)
        s = 1.0 / (1.0 + np.exp(z))  # σ(−z) = −d/dz log σ(z)
        grad[p, hi] -= beta * s * mask[p, hi]
        grad[p, lo] += beta * s * mask[p, lo]
    n = len(used)
    return (sum(losses) / n if n else 0.0), grad / max(n, 1), margins, n


def make_batch(seed=0):
    rng = np.random.default_rng(seed)
    rewards = rng.integers(0, 3, size=(P, G)).astype(np.float32)
    rewards[0] = [1.0, 0.0, 1.0, 0.0]  # ties at both ends: y+ = 0, y- = 1
    rewards[1] = 1.0  # no spread
    rewards[2] = [2.0, 0.0, 1.0, 1.0]
    rewards[3] = [0.0, 0.0, 0.0, 1.0]
    lengths = rng.integers(1, T + 1, size=(P, G))
    lengths[2, 0] = 0  # the best response of group 2 is empty (e.g. overlong-filtered): y+ is its runner-up
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    logp = (rng.normal(size=(P, G, T)) - 2.0).astype(np.float32)
    ref = (logp + rng.normal(size=logp.shape) * 0.5).astype(np.float32)
    logp = np.where(mask > 0, logp, np.nan).astype(np.float32)  # padding must never leak
    return rewards, logp, ref, mask


def test_pair_picks_first_best_and_first_worst_and_skips_flat_groups():
    rewards, _, _, mask = make_batch()
    pair = np.asarray(gdpo_pair(rewards, mask=mask))
    np.testing.assert_array_equal(pair[0], [1, -1, 0, 0])
    np.testing.assert_array_equal(pair[1], [0, 0, 0, 0])
    np.testing.assert_array_equal(pair[2], [0, -1, 1, 0])  # response 0 has no token: 2 is the first best
    np.testing.assert_array_equal(pair[3], [-1, 0, 0, 1])
    for p, pr in enumerate(np_pair(rewards, mask)):
        expected = np.zeros(G)
        if pr is not None:
            expected[pr[0]], expected[pr[1]] = 1, -1
        np.testing.assert_array_equal(pair[p], expected)
    # `valid` takes responses out of the competition; fewer than two left = no pair
    valid = np.ones((P, G), bool)
    valid[0, 0] = False
    valid[3, :3] = False
    pair = np.asarray(gdpo_pair(rewards, valid=valid))
    np.testing.assert_array_equal(pair[0], [0, -1, 1, 0])
    np.testing.assert_array_equal(pair[3], [0, 0, 0, 0])
    with pytest.raises(ValueError, match="kl_beta"):
        gdpo_pair(rewards, kl_penalty=np.zeros((P, G, T)))


def test_loss_and_gradient_match_numpy():
    cfg = load_objective("gdpo")
    rewards, logp, ref, mask = make_batch()
    adv = compute_advantages(cfg, rewards, mask)

    def loss(lp):
        s, d, _ = objective_terms(cfg, logp=lp, old_logp=jnp.zeros_like(lp), advantages=adv, mask=mask, ref_logp=ref)
        return s / d

    value, grad = jax.jit(jax.value_and_grad(loss))(jnp.asarray(logp))
    want, want_grad, _, n = np_gdpo(rewards, np.nan_to_num(logp), ref, mask)
    assert 3 <= n < P  # groups 0, 2, 3 have a pair; the flat group 1 contributes nothing
    np.testing.assert_allclose(float(value), want, rtol=1e-5)
    np.testing.assert_allclose(np.asarray(grad), want_grad, rtol=1e-4, atol=1e-7)
    assert np.all(np.asarray(grad)[1] == 0) and np.all(np.asarray(grad)[mask == 0] == 0)


def test_metrics_and_additivity_over_prompt_splits():
    cfg = load_objective("gdpo", gdpo_beta=0.5)
    rewards, logp, ref, mask = make_batch(seed=3)
    adv = np.asarray(compute_advantages(cfg, rewards, mask))
    terms = jax.jit(objective_terms, static_argnums=0)
    whole = terms(cfg, logp=logp, old_logp=logp, advantages=adv, mask=mask, ref_logp=ref)
    parts = [terms(cfg, logp=logp[s], old_logp=logp[s], advantages=adv[s], mask=mask[s], ref_logp=ref[s])
             for s in (slice(0, 2), slice(2, P))]
    chex.assert_trees_all_close(float(whole[0]), sum(float(p[0]) for p in parts), rtol=1e-6)
    got = finalize_metrics(combine_metrics([p[2] for p in parts]))
    want, _, margins, n = np_gdpo(rewards, np.nan_to_num(logp), ref, mask, beta=0.5)
    assert float(whole[1]) == sum(float(p[1]) for p in parts) == n
    np.testing.assert_allclose(float(got["policy_loss"]), want, rtol=1e-5)
    np.testing.assert_allclose(float(got["margin_mean"]), np.mean(margins), rtol=1e-5)
    np.testing.assert_allclose(float(got["preference_accuracy"]), np.mean(np.array(margins) > 0))
    np.testing.assert_allclose(float(got["groups_used"]), n / P)


def test_no_pair_anywhere_gives_zero_denominator_and_no_gradient():
    cfg = load_objective("gdpo")
    _, logp, ref, mask = make_batch()
    adv = compute_advantages(cfg, np.ones((P, G), np.float32), mask)

    def loss_sum(lp):
        return objective_terms(cfg, logp=lp, old_logp=lp, advantages=adv, mask=mask, ref_logp=ref)[0]

    s, d, _ = objective_terms(cfg, logp=logp, old_logp=logp, advantages=adv, mask=mask, ref_logp=ref)
    assert float(s) == 0.0 and float(d) == 0.0
    assert np.all(np.asarray(jax.grad(loss_sum)(jnp.asarray(logp))) == 0)


def test_config_selects_gdpo_and_requires_the_reference():
    cfg = load_objective("gdpo")
    assert (cfg.kind, cfg.advantage, cfg.gdpo_beta, cfg.kl_beta) == ("gdpo", "gdpo_pair", 0.1, 0.0)
    assert cfg.needs_reference and not ObjectiveConfig().needs_reference
    assert set(OBJECTIVE_KINDS) | {"policy_gradient"} == set(ObjectiveConfig.model_fields["kind"].annotation.__args__)
    assert ADVANTAGES["gdpo_pair"] is gdpo_pair
    with pytest.raises(ValueError, match="go together"):
        ObjectiveConfig(kind="gdpo")
    with pytest.raises(ValueError, match="go together"):
        ObjectiveConfig(advantage="gdpo_pair")
    with pytest.raises(ValueError, match="kl_beta=0"):
        load_objective("gdpo", kl_beta=0.04)
    rewards, logp, ref, mask = make_batch()
    with pytest.raises(ValueError, match="ref_logp is required"):
        objective_terms(cfg, logp=logp, old_logp=logp, advantages=np.zeros((P, G)), mask=mask)


# ----------------------------------------------------------------------------- the train step
def _tiny_model():
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder

    cfg = ModelConfig(model_type="qwen2", vocab_size=32, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(0))


def test_train_step_does_not_depend_on_micro_batches():
    from dapo_jax.models.logprobs import response_logprobs
    from dapo_jax.training.config.sections import OptimSection
    from dapo_jax.training.update.train_step import Batch, init_train_state, make_optimizer, make_train_step

    cfg = load_objective("gdpo", gdpo_beta=1.0)
    p_, s_ = 4, 3
    rewards, _, ref, mask = make_batch(seed=5)
    rewards, ref, mask = rewards[:p_], ref[:p_], mask[:p_]
    rng = np.random.default_rng(1)
    adv = np.asarray(compute_advantages(cfg, rewards, mask))[..., None] * mask
    batch = Batch(prompt_ids=jnp.asarray(rng.integers(0, 32, (p_, s_)), jnp.int32),
                  prompt_mask=jnp.ones((p_, s_), jnp.int32),
                  response_ids=jnp.asarray(rng.integers(0, 32, (p_, G, T)), jnp.int32),
                  response_mask=jnp.asarray(mask), old_logp=jnp.asarray(ref), advantages=jnp.asarray(adv),
                  ref_logp=jnp.asarray(ref))
    graphdef, params = nnx.split(_tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))

    # reference: the whole batch's logp, the NumPy gradient w.r.t. it, pulled back to the parameters
    def logp_of(params):
        return response_logprobs(nnx.merge(graphdef, params), batch.prompt_ids, batch.prompt_mask,
                                 batch.response_ids, batch.response_mask, temperature=1.0)[0]

    logp, pullback = jax.vjp(logp_of, params)
    want_loss, dlogp, _, n = np_gdpo(rewards, np.asarray(logp), ref, mask, beta=1.0)
    assert n >= 2
    want_norm = float(optax.tree.norm(pullback(jnp.asarray(dlogp, jnp.float32))[0]))

    got = {}
    for micro in (1, 4):  # 4 = one prompt per micro-batch
        step = make_train_step(graphdef, tx, schedule, objective=cfg, micro_batches=micro, use_ref=True)
        state, metrics = step(init_train_state(nnx.split(_tiny_model())[1], tx), batch)
        got[micro] = [np.asarray(x) for x in jax.tree.leaves(state.params)]
        np.testing.assert_allclose(float(metrics["loss"]), want_loss, rtol=1e-5, err_msg=f"micro_batches={micro}")
        np.testing.assert_allclose(float(metrics["grad_norm"]), want_norm, rtol=1e-4, err_msg=f"micro_batches={micro}")
        np.testing.assert_allclose(float(metrics["groups_used"]), n / p_)
    for micro in (4,):
        for a, b in zip(got[micro], got[1]):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6, err_msg=f"micro_batches={micro}")
