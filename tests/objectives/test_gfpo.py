"""GFPO (docs/objectives.md#gfpo-gdpo): the kept-subset selection, adaptive k, the subset advantage, that dropped
responses contribute nothing to the loss, its gradient or its denominator, micro-batch invariance of
the update, and a 2-step end-to-end run of the `gfpo` recipe."""

from pathlib import Path

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.objectives import ObjectiveConfig, load_objective, objective_terms
from dapo_jax.objectives import gfpo

REPO = Path(__file__).resolve().parents[2]
keep_jit = jax.jit(gfpo.keep_mask, static_argnames="metric")


# ---------------------------------------------------------------- plain-NumPy references

def ref_keep(rewards, lengths, k, metric, valid=None):
    """For each prompt, sort the valid responses by (score descending, index ascending), keep k."""
    P, G = rewards.shape
    valid = np.ones((P, G), bool) if valid is None else valid
    k = np.broadcast_to(np.asarray(k), (P,))
    out = np.zeros((P, G), bool)
    for p in range(P):
        score = [-float(lengths[p, g]) if metric == "length" else float(rewards[p, g]) / max(float(lengths[p, g]), 1.0)
                 for g in range(G)]
        order = sorted((g for g in range(G) if valid[p, g]), key=lambda g: (-score[g], g))
        out[p, order[: int(k[p])]] = True
    return out


def ref_subset_adv(rewards, keep, eps, unbiased):
    out = np.zeros(rewards.shape, np.float64)
    for p in range(rewards.shape[0]):
        s = rewards[p, keep[p]].astype(np.float64)
        if len(s) < 2 or s.max() == s.min():
            continue
        out[p, keep[p]] = (s - s.mean()) / (s.std(ddof=1 if unbiased else 0) + eps)
    return out


def ref_k(prompt_mean, window, ks):
    q = np.quantile(np.asarray(window, np.float64), [0.25, 0.5, 0.75]).astype(np.float32)
    return np.array([ks[int(np.sum(m > q))] for m in np.asarray(prompt_mean, np.float32)])


# ---------------------------------------------------------------- selection

@pytest.mark.parametrize("metric", ["length", "token_efficiency"])
def test_selection_matches_numpy_with_ties_and_per_prompt_k(metric):
    rng = np.random.default_rng(0)
    P, G = 24, 8
    rewards = rng.choice([-1.0, 1.0, 0.5], size=(P, G)).astype(np.float32)
    lengths = rng.integers(1, 5, size=(P, G)).astype(np.int32)  # few values: many exact ties
    rewards[0], lengths[0] = 1.0, 3  # every score equal: the k lowest indices win
    rewards[1, :2], lengths[1, :2] = [1.0, 0.5], [4, 2]  # token efficiency 0.25 == 0.25
    valid = rng.random((P, G)) < 0.85
    for k in (4, rng.integers(2, G + 1, size=P)):
        for v in (None, valid):
            got = np.asarray(keep_jit(rewards, lengths, k, metric=metric, valid=v))
            np.testing.assert_array_equal(got, ref_keep(rewards, lengths, k, metric, v))
    np.testing.assert_array_equal(np.asarray(keep_jit(rewards, lengths, 3, metric=metric))[0], [1, 1, 1, 0, 0, 0, 0, 0])


def test_selection_uses_generated_lengths_not_the_filtered_mask():
    # A truncated response has the full max_new_tokens length; overlong filtering zeroes its mask, but it
    # is still the LONGEST, never "empty, hence shortest". Padding groups (invalid) keep nothing.
    T = 6
    lengths = np.array([[6, 2, 6, 3], [1, 6, 4, 2], [6, 6, 6, 5]], np.int32)
    truncated = lengths == T
    mask = (np.arange(T) < lengths[..., None]) & ~truncated[..., None]
    rewards = np.where(truncated, -1.0, 1.0).astype(np.float32)
    valid = np.array([[1, 1, 1, 1], [1, 1, 1, 1], [0, 0, 0, 0]], bool)
    keep = np.asarray(keep_jit(rewards, lengths, 2, metric="length", valid=valid))
    np.testing.assert_array_equal(keep, [[0, 1, 0, 1], [1, 0, 0, 1], [0, 0, 0, 0]])
    assert not (keep & truncated).any()
    np.testing.assert_array_equal(np.asarray(gfpo.filter_mask(mask, keep)).sum(-1), np.where(keep, lengths, 0))
    # without `valid`: the one untruncated response, then the lowest index among the tied truncated ones
    np.testing.assert_array_equal(np.asarray(keep_jit(rewards, lengths, 2, metric="length"))[2], [1, 0, 0, 1])
    np.testing.assert_array_equal(np.asarray(keep_jit(rewards, lengths, 2, metric="token_efficiency"))[2], [1, 0, 0, 1])


def test_adaptive_k_matches_numpy_quartiles():
    rng = np.random.default_rng(1)
    window = rng.choice([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0], size=40).astype(np.float32)
    means = np.concatenate([window[:10], rng.uniform(-1.2, 1.2, size=20)]).astype(np.float32)  # ties on quartiles
    ks = (8, 6, 4, 4)
    q = np.quantile(window.astype(np.float64), [0.25, 0.5, 0.75]).astype(np.float32)
    got = np.asarray(jax.jit(gfpo.difficulty_keep, static_argnums=2)(means, q, ks))
    np.testing.assert_array_equal(got, ref_k(means, window, ks))
    assert set(got.tolist()) == {8, 6, 4}
    np.testing.assert_array_equal(np.asarray(gfpo.difficulty_keep(q, q, ks)), [8, 6, 4])  # equal: harder bucket
    with pytest.raises(ValueError, match="thresholds"):
        gfpo.difficulty_keep(means, q[:2], ks)


def test_bad_inputs_and_config():
    with pytest.raises(ValueError, match="gfpo_metric"):
        gfpo.scores(np.zeros((2, 3)), np.ones((2, 3)), metric="bogus")
    with pytest.raises(ValueError, match=r"\[P, G\]"):
        gfpo.scores(np.zeros((2, 3)), np.ones((2, 4)), metric="length")
    with pytest.raises(ValueError):
        ObjectiveConfig(gfpo_keep=1)
    with pytest.raises(ValueError, match="gfpo_adaptive"):
        ObjectiveConfig(gfpo_adaptive=(8, 6, 4, 1))
    cfg = load_objective("gfpo", overlong_buffer=None)
    assert cfg.gfpo and cfg.gfpo_keep == 4 and cfg.gfpo_metric == "length" and not ObjectiveConfig().gfpo
    hash(load_objective("gfpo", gfpo_adaptive=[8, 6, 4, 4], overlong_buffer=None))  # a static jit argument


# ---------------------------------------------------------------- subset advantage

@pytest.mark.parametrize("eps,unbiased", [(1e-6, True), (1e-4, False), (0.0, True)])
def test_subset_advantage_matches_numpy(eps, unbiased):
    rng = np.random.default_rng(2)
    P, G = 16, 8
    rewards = rng.choice([-1.0, 1.0], size=(P, G)).astype(np.float32) + rng.choice([0.0, -0.5], size=(P, G))
    keep = np.array(keep_jit(rewards, rng.integers(1, 9, size=(P, G)), 4, metric="length"))
    rewards[0] = [1, 1, 1, 1, -1, -1, -1, -1]  # spread in the group, none in the kept subset
    keep[0] = [1, 1, 1, 1, 0, 0, 0, 0]
    keep[1] = False
    keep[1, 3] = True  # a subset of one
    adv = np.asarray(jax.jit(gfpo.subset_advantages, static_argnames=("eps", "unbiased"))(
        rewards, keep, eps=eps, unbiased=unbiased))
    assert np.isfinite(adv).all()
    np.testing.assert_allclose(adv, ref_subset_adv(rewards, keep, eps, unbiased), rtol=1e-5, atol=1e-6)
    assert (adv[~keep] == 0).all() and (adv[:2] == 0).all()


# ---------------------------------------------------------------- dropped responses contribute nothing

def _batch(seed, P=4, G=6, T=7, k=3):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    rewards = rng.choice([-1.0, 1.0], size=(P, G)).astype(np.float32)
    keep = np.asarray(keep_jit(rewards, lengths, k, metric="token_efficiency"))
    old = (rng.normal(size=(P, G, T)) - 1.5).astype(np.float32)
    logp = (old + rng.normal(size=old.shape) * 0.4).astype(np.float32)
    return dict(rewards=rewards, keep=keep, mask=mask, old=old, logp=logp, lengths=lengths)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean"])
def test_dropped_responses_leave_loss_gradient_and_denominator(agg):
    b = _batch(3)
    cfg = ObjectiveConfig(loss_agg=agg, gfpo_keep=3)
    adv = gfpo.subset_advantages(b["rewards"], b["keep"])
    mask = gfpo.filter_mask(b["mask"], b["keep"])

    @jax.jit
    def terms(logp, old):
        (s, (d, _)), g = jax.value_and_grad(
            lambda lp: (lambda s, d, m: (s, (d, m)))(*objective_terms(cfg, logp=lp, old_logp=old, advantages=adv, mask=mask)),
            has_aux=True)(logp)
        return s, d, g

    s, d, g = terms(b["logp"], b["old"])
    # NumPy reference over the kept responses alone: clipped surrogate, clip-higher 0.2 / 0.28
    ratio = np.exp(b["logp"].astype(np.float64) - b["old"])
    a = np.asarray(adv, np.float64)[..., None]
    loss = -np.minimum(ratio * a, np.clip(ratio, 0.8, 1.28) * a)
    kept = b["mask"] * b["keep"][..., None]
    if agg == "token_mean":
        ref_s, ref_d = (loss * kept).sum(), kept.sum()
    else:
        n = kept.sum(-1)
        ref_s, ref_d = ((loss * kept).sum(-1) / np.maximum(n, 1)).sum(), (n > 0).sum()
    np.testing.assert_allclose(float(s), ref_s, rtol=1e-5)
    assert float(d) == ref_d
    assert (np.asarray(g)[~b["keep"]] == 0).all()
    # anything in the dropped responses (here ratios far outside the clip) changes nothing
    junk_logp, junk_old = b["logp"].copy(), b["old"].copy()
    junk_logp[~b["keep"]] = 30.0
    junk_old[~b["keep"]] = -50.0
    chex.assert_trees_all_equal((s, d, g), terms(junk_logp, junk_old))


# ---------------------------------------------------------------- the update: micro-batch invariance

def _tiny_model():
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder

    cfg = ModelConfig(model_type="qwen2", vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(0))


def test_train_step_micro_batch_invariant_and_blind_to_dropped_responses():
    from dapo_jax.training.config.sections import OptimSection
    from dapo_jax.training.update.train_step import Batch, init_train_state, make_optimizer, make_train_step

    P, G, S, T, V = 4, 4, 3, 5, 32
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    rewards = rng.choice([-1.0, 1.0], size=(P, G)).astype(np.float32) - 0.1 * lengths
    keep = np.asarray(keep_jit(rewards, lengths, 2, metric="length"))
    adv = np.asarray(gfpo.subset_advantages(rewards, keep))[..., None] * mask
    ids = rng.integers(0, V, (P, G, T))
    batch = Batch(jnp.asarray(rng.integers(0, V, (P, S)), jnp.int32), jnp.ones((P, S), jnp.int32),
                  jnp.asarray(ids, jnp.int32), jnp.asarray(gfpo.filter_mask(mask, keep)),
                  jnp.asarray(np.log(1.0 / V) + 0.3 * rng.normal(size=(P, G, T)) * mask, jnp.float32),
                  jnp.asarray(adv, jnp.float32), jnp.zeros((P, G, T), jnp.float32))
    ids_junk = np.where(keep[..., None], ids, rng.integers(0, V, (P, G, T)))
    junk = batch._replace(response_ids=jnp.asarray(ids_junk, jnp.int32),
                          old_logp=jnp.where(jnp.asarray(keep)[..., None], batch.old_logp, -50.0))
    assert not np.array_equal(ids_junk, ids)

    cfg = load_objective("gfpo", overlong_buffer=None, max_response_length=T)
    graphdef, params = nnx.split(_tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))
    out = {}
    for micro in (1, 2):
        step = make_train_step(graphdef, tx, schedule, objective=cfg, num_minibatches=1, micro_batches=micro)
        for name, b in (("batch", batch), ("junk", junk)):
            state, m = step(init_train_state(jax.tree.map(jnp.copy, params), tx), b)
            out[micro, name] = (state.params, m)
    whole, m_whole = out[1, "batch"]
    assert float(m_whole["update_tokens"]) == float((mask * keep[..., None]).sum())
    assert float(m_whole["grad_norm"]) > 0
    for key in ((2, "batch"), (1, "junk"), (2, "junk")):
        p, m = out[key]
        np.testing.assert_allclose(m["loss"], m_whole["loss"], rtol=1e-5, atol=1e-7)
        np.testing.assert_allclose(m["grad_norm"], m_whole["grad_norm"], rtol=1e-5)
        chex.assert_trees_all_close(p, whole, rtol=1e-4, atol=2e-5)  # Adam divides by |g|: float32 order noise


# ---------------------------------------------------------------- end to end

@pytest.mark.slow
def test_two_gfpo_steps_end_to_end(tmp_path):
    from dapo_jax.cli import main
    from dapo_jax.training.metrics import read_metrics

    run_dir = tmp_path / "run"
    assert main(["train", str(REPO / "dapo_jax" / "configs" / "tiny_dapo.yaml"), "objective.name=gfpo", "train.steps=2", "train.eval_every=0",
                 "data.eval=null", "train.checkpoint_every=1", "train.progress=false",
                 "train.tensorboard=false", f"train.run_dir={run_dir}"]) == 0
    rows = [r for r in read_metrics(run_dir) if "reward_mean" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["gfpo/kept_per_group"] == 4.0  # G' = 8, k = 4
        for key in ("gfpo/kept_length_mean", "gfpo/generated_length_mean", "response_length_mean", "loss"):
            assert np.isfinite(r[key]), key
        # the update's tokens are exactly the kept responses' (overlong filtering is off)
        np.testing.assert_allclose(r["update_tokens"],
                                   r["gfpo/kept_length_mean"] * r["gfpo/kept_per_group"] * r["trained_groups"], rtol=1e-6)
    assert any(r["gfpo/kept_length_mean"] < r["gfpo/generated_length_mean"] for r in rows)
