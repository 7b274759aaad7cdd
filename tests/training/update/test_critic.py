"""The critic of PPO / VAPO: its update is exact under micro-batching, VAPO's NLL term is too, its state
is saved and verified in the checkpoint, a run resumes exactly (2 + 2 steps = 4), and the ppo / vapo
recipes run end to end."""

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.models.logprobs import response_logprobs
from dapo_jax.models.value_head import ValueModel, response_values
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.gae import value_loss
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.state.checkpoint_errors import CheckpointError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.config.sections import OptimSection
from dapo_jax.training.update.critic import Critic, CriticBatch, critic_values, make_critic_step, policy_nll_weights
from dapo_jax.training.update.train_step import Batch, _split, init_train_state, make_optimizer, make_train_step

from tests.objectives.test_gae import np_gae_skipping

REPO = Path(__file__).resolve().parents[3]
P, G, S, T, V = 4, 3, 5, 6, 32
OPTIM = OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None)


def tiny_decoder(seed=0):
    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((P, S), np.int32)
    prompt_mask[0, :2] = 0
    lengths = rng.integers(1, T + 1, size=(P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    return dict(prompt_ids=jnp.asarray(rng.integers(0, V, (P, S)), jnp.int32), prompt_mask=jnp.asarray(prompt_mask),
                response_ids=jnp.asarray(rng.integers(0, V, (P, G, T)), jnp.int32), response_mask=jnp.asarray(mask),
                rng=rng)


def adam_first_step(params, grads, lr=1e-2):
    # Adam's first step: m/(sqrt(v)+eps) = g/(|g|+eps) (bias-corrected), so Δ = -lr * g/(|g|+eps).
    return jax.tree.map(lambda p, g: p - lr * g / (jnp.abs(g) + 1e-8), params, grads)


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def assert_first_adam_step(out, whole, params, prefix=""):
    """Each `(state, metrics)` of `out` is Adam's first step on the loss `whole(params)`, by hand."""
    loss, grads = jax.jit(jax.value_and_grad(whole))(params)
    expected = adam_first_step(params, grads)
    for state, m in out.values():
        np.testing.assert_allclose(float(m[prefix + "loss"]), float(loss), rtol=1e-5)
        np.testing.assert_allclose(float(m[prefix + "grad_norm"]), float(optax.tree.norm(grads)), rtol=1e-4)
        for x, y in zip(leaves(state.params), leaves(expected)):
            np.testing.assert_allclose(x, y, rtol=1e-4, atol=2e-5)


def test_critic_update_is_the_whole_batch_value_loss_step_for_any_micro_batches():
    a = arrays()
    rng = a.pop("rng")
    old = jnp.asarray(rng.normal(size=(P, G, T)) * 0.3, jnp.float32)
    cb = CriticBatch(**a, old_values=old, returns=jnp.asarray(rng.choice([-1.0, 1.0], (P, G, T)), jnp.float32))
    graphdef, params = nnx.split(ValueModel(tiny_decoder(), rngs=nnx.Rngs(1)))
    tx, schedule = make_optimizer(OPTIM)
    out = {}
    for micro in (4,):  # against the whole-batch reference below: one compilation fewer than micro 1 too
        step = make_critic_step(graphdef, tx, schedule, clip_eps=0.5, num_minibatches=1, micro_batches=micro)
        out[micro] = step(init_train_state(jax.tree.map(jnp.copy, params), tx), cb)  # the state is donated

    def whole(p):
        v = response_values(nnx.merge(graphdef, p), cb.prompt_ids, cb.prompt_mask, cb.response_ids, cb.response_mask)
        s, d, _ = value_loss(v, cb.old_values, cb.returns, cb.response_mask, clip_eps=0.5)
        return s / d

    assert_first_adam_step(out, whole, params, prefix="critic/")
    for state, m in out.values():
        assert int(state.step) == 1 and float(m["critic/update_applied"]) == 1.0


@pytest.mark.parametrize("n,micro", [(2, 1), (2, 2), (1, 4)])
def test_nll_weights_follow_the_policy_updates_split(n, micro):
    a = arrays(1)
    rng = a["rng"]
    correct = rng.random((P, G)) < 0.5
    cfg = ObjectiveConfig(nll_coef=0.1)
    w = np.asarray(policy_nll_weights(cfg, a["response_mask"], correct, num_minibatches=n, micro_batches=micro))
    mask = np.asarray(a["response_mask"])
    for j, prompts in enumerate(np.asarray(_split(jnp.arange(P), n, micro)).reshape(n, -1)):
        c = mask[prompts] * correct[prompts][..., None]
        # Σ_t w over the optimizer batch = μ·D_batch: the NLL term divided by D_batch is μ·mean(-logp)
        if c.sum():
            np.testing.assert_allclose(w[prompts].sum(), 0.1 * mask[prompts].sum(), rtol=1e-6)
        assert np.all(w[prompts][c == 0] == 0.0)


def test_policy_update_with_nll_is_exact_under_micro_batches():
    a = arrays(2)
    rng = a.pop("rng")
    cfg = ObjectiveConfig(nll_coef=0.1, eps_low=0.2, eps_high=0.28)
    correct = rng.random((P, G)) < 0.5
    mask = a["response_mask"]
    batch = Batch(**a, old_logp=jnp.asarray(np.log(1 / V) + rng.normal(size=(P, G, T)) * 0.3 * np.asarray(mask),
                                            jnp.float32),
                  advantages=jnp.asarray(np.repeat(rng.normal(size=(P, G, 1)), T, 2), jnp.float32) * mask,
                  ref_logp=jnp.zeros((P, G, T), jnp.float32),
                  nll_weight=policy_nll_weights(cfg, mask, correct, num_minibatches=1, micro_batches=1))
    graphdef, params = nnx.split(tiny_decoder(3))
    tx, schedule = make_optimizer(OPTIM)
    out = {micro: make_train_step(graphdef, tx, schedule, objective=cfg, micro_batches=micro)(
        init_train_state(jax.tree.map(jnp.copy, params), tx), batch) for micro in (4,)}

    def whole(p):  # L_PPO (token mean) + μ·mean of -logp over the correct responses' tokens, by hand
        logp, _ = response_logprobs(nnx.merge(graphdef, p), batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                    mask)
        ratio = jnp.exp(logp - batch.old_logp)
        adv = batch.advantages
        ppo = jnp.sum(-jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.28) * adv) * mask) / jnp.sum(mask)
        c = mask * jnp.asarray(correct, jnp.float32)[..., None]
        return ppo + 0.1 * jnp.sum(-logp * c) / jnp.sum(c)

    assert_first_adam_step(out, whole, params)


def test_checkpoint_saves_verifies_and_restores_the_critic(tmp_path):
    tree = lambda s: {"w": jnp.full((3, 2), float(s)), "n": jnp.asarray(s, jnp.int32)}  # noqa: E731
    ckpt = Checkpointer(tmp_path, async_save=False)
    ckpt.save(1, tree(1), meta={"x": 1}, critic=tree(10))
    ckpt.save(2, tree(2), meta={"x": 2})  # a run without a critic
    restored = ckpt.restore(1, tree(0), critic=tree(0))
    np.testing.assert_array_equal(np.asarray(restored.critic["w"]), np.full((3, 2), 10.0))
    assert ckpt.restore(1, tree(0)).critic is None  # the policy alone still restores (eval, export)
    with pytest.raises(CheckpointError, match="no critic"):
        ckpt.restore(2, tree(0), critic=tree(0))
    with pytest.raises(CheckpointError, match="does not fit"):
        ckpt.restore(1, tree(0), critic={"w": jnp.zeros((4, 2)), "n": jnp.zeros((), jnp.int32)})
    with pytest.raises(Exception, match="not finite|refusing"):
        ckpt.save(3, tree(3), meta={}, critic={"w": jnp.full((3, 2), jnp.nan), "n": jnp.zeros((), jnp.int32)})
    ckpt.close()


def _critic_params(cfg, run_dir):
    """(policy params, critic params, step) of the run's newest checkpoint."""
    from dapo_jax.training.update.critic import Critic
    from dapo_jax.training.loop import build_mesh, load_model, load_tokenizer

    mesh = build_mesh(cfg)
    with jax.set_mesh(mesh):
        params = nnx.state(load_model(cfg, mesh, load_tokenizer(cfg)))
        policy = jax.eval_shape(lambda p: init_train_state(p, make_optimizer(cfg.optim)[0]), params)
        critic = Critic.build(cfg, mesh).init_state
        ckpt = Checkpointer(Path(run_dir) / "checkpoints")
        r = ckpt.restore_latest(policy._replace(params=params), critic=critic)
        ckpt.close()
    return leaves(r.state), leaves(r.critic), r.step


@pytest.mark.slow
def test_vapo_resumed_2_plus_2_equals_4_uninterrupted(tiny_model_dir, tmp_path, overrides_for):
    from dapo_jax.training.loop import train
    from dapo_jax.training.metrics import read_metrics

    extra = {"objective.name": "vapo", "objective.value_pretrain_steps": 2, "data.eval": "null", "critic.lr": 1e-3,
             "critic.num_minibatches": 2, "optim.num_minibatches": 2, "train.steps": 4, "train.checkpoint_every": 2}
    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    train(load_config(None, overrides_for(tiny_model_dir, resumed, **{**extra, "train.steps": 2})))
    cfg = load_config(None, overrides_for(tiny_model_dir, resumed, **extra))
    train(cfg)
    train(load_config(None, overrides_for(tiny_model_dir, straight, **extra)))
    pol_a, crit_a, step_a = _critic_params(cfg, resumed)
    pol_b, crit_b, step_b = _critic_params(cfg, straight)
    assert step_a == step_b == 4
    for x, y in zip(pol_a + crit_a, pol_b + crit_b):
        np.testing.assert_allclose(x, y, rtol=0, atol=1e-6)
    _, crit_init, _ = _critic_params(cfg, resumed)
    rows_a, rows_b = read_metrics(resumed), read_metrics(straight)
    for key in ("reward_mean", "critic/value_loss", "nll", "critic/pretrain_value_loss_last"):
        assert [r[key] for r in rows_a if key in r] == [r[key] for r in rows_b if key in r], key
    # the critic did train: (2 pre-training steps + 4 steps) x 2 mini-batches = 12 optimizer updates
    assert int(crit_a[-2]) == 12  # TrainState(params, opt_state, step, skipped): step


@pytest.mark.slow
@pytest.mark.parametrize("name", ["ppo", "vapo"])
def test_three_steps_end_to_end(name, tmp_path):
    import math

    from dapo_jax.training.loop import train
    from dapo_jax.training.metrics import read_metrics

    cfg = load_config(REPO / "dapo_jax" / "configs" / f"tiny_{name}.yaml", [
        f"train.run_dir={tmp_path / 'run'}", "train.steps=3", "train.eval_every=0", "train.eval_k=2",
        "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false", "data.eval_size=16",
        "rollout.G=4", "rollout.train_batch=8", "rollout.gen_batch=8", "objective.value_pretrain_steps=2"
        if name == "vapo" else "objective.gae_lambda=0.9"])
    assert cfg.objective_config.uses_critic
    train(cfg)
    rows = read_metrics(tmp_path / "run")
    steps = [r for r in rows if "grad_norm" in r]
    assert len(steps) == 3
    for r in steps:
        for key in ("loss", "grad_norm", "critic/loss", "critic/grad_norm", "critic/value_mean", "advantage_std"):
            assert math.isfinite(r[key]), (key, r)
        assert r["critic/update_applied"] == 1.0 and r["update_applied"] == 1.0
    assert any(r["critic/grad_norm"] > 0 for r in steps)
    if name == "vapo":
        assert any("critic/pretrain_value_loss_first" in r for r in rows)
        assert all("nll" in r for r in steps)


def episode_arrays(seed=0):
    """A hand-built episode batch: per row a model turn, tool/template ids (context only), a second model turn,
    padding. `response_mask` is the model's ids, `context_mask` every real id."""
    a = arrays(seed)
    context = np.zeros((P, G, T), np.float32)
    model = np.zeros((P, G, T), np.float32)
    context[..., :5] = 1
    model[..., :2] = 1  # turn 1
    model[..., 4] = 1  # turn 2 (ids 2, 3: the tool's answer)
    context[0, 0, 5:] = 1  # one row ends on a longer second turn
    model[0, 0, 5:] = 1
    context[1, 1] = model[1, 1] = (np.arange(T) < 3)  # one row with a single turn
    a.update(response_mask=jnp.asarray(model), context_mask=jnp.asarray(context))
    return a


def test_critic_update_on_an_episode_sees_the_context_and_counts_model_ids_only():
    a = episode_arrays()
    rng = a.pop("rng")
    old = jnp.asarray(rng.normal(size=(P, G, T)) * 0.3, jnp.float32)
    returns = jnp.asarray(rng.choice([-1.0, 1.0], (P, G, T)), jnp.float32)
    cb = CriticBatch(**a, old_values=old, returns=returns)
    graphdef, params = nnx.split(ValueModel(tiny_decoder(), rngs=nnx.Rngs(1)))
    tx, schedule = make_optimizer(OPTIM)
    step = make_critic_step(graphdef, tx, schedule, clip_eps=0.5, num_minibatches=1, micro_batches=2)
    out = {2: step(init_train_state(jax.tree.map(jnp.copy, params), tx), cb)}

    def whole(p):  # the forward attends with every real id; the loss counts the model's ids
        v = response_values(nnx.merge(graphdef, p), cb.prompt_ids, cb.prompt_mask, cb.response_ids, cb.context_mask)
        s, d, _ = value_loss(v, cb.old_values, cb.returns, cb.response_mask, clip_eps=0.5)
        return s / d

    assert_first_adam_step(out, whole, params, prefix="critic/")
    # the tool ids are in the forward: the values of turn 2 differ from a forward that drops them
    got = critic_values(graphdef, params, cb.prompt_ids, cb.prompt_mask, cb.response_ids, cb.response_mask,
                        cb.context_mask)
    blind = critic_values(graphdef, params, cb.prompt_ids, cb.prompt_mask, cb.response_ids, cb.response_mask)
    m = np.asarray(cb.response_mask)
    assert np.all(np.asarray(got)[m == 0] == 0.0)
    assert not np.allclose(np.asarray(got)[..., 4], np.asarray(blind)[..., 4])
    # targets and old values on tool ids never reach the update
    off = np.asarray(cb.context_mask) * (1 - m)
    noisy = cb._replace(old_values=cb.old_values + 50.0 * off, returns=cb.returns - 70.0 * off)
    other = step(init_train_state(jax.tree.map(jnp.copy, params), tx), noisy)
    for x, y in zip(leaves(other[0].params), leaves(out[2][0].params)):
        np.testing.assert_array_equal(x, y)


def test_prepare_runs_gae_over_an_episodes_model_ids():
    """`Critic.prepare` on an episode: V_old from the context forward on model ids, advantages and targets =
    GAE over each row's model ids with the tool ids removed (float64 reference)."""
    a = episode_arrays(1)
    rng = a.pop("rng")
    graphdef, params = nnx.split(ValueModel(tiny_decoder(), rngs=nnx.Rngs(2)))
    obj = ObjectiveConfig(advantage="gae", gamma=0.9, gae_lambda=0.8, critic_lambda=0.95, whiten_advantages=False,
                          kl_beta=0.0)
    critic = Critic(obj, graphdef, None, None, 1, 1)
    rewards = jnp.asarray(rng.choice([-1.0, 1.0], (P, G)), jnp.float32)
    valid = jnp.ones((P, G), bool)
    batch = Batch(a["prompt_ids"], a["prompt_mask"], a["response_ids"], a["response_mask"], None,
                  jnp.zeros((P, G, T)), None, context_mask=a["context_mask"])
    out, cb = jax.jit(lambda p: critic.prepare(p, batch, rewards, valid, jnp.zeros((P, G), bool), chunks=2))(params)
    v = np.asarray(response_values(nnx.merge(graphdef, params), a["prompt_ids"], a["prompt_mask"], a["response_ids"],
                                   a["context_mask"]), np.float64)
    m = np.asarray(a["response_mask"])
    np.testing.assert_allclose(np.asarray(cb.old_values), v * m, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(cb.context_mask), np.asarray(a["context_mask"]))
    R = np.asarray(rewards, np.float64)
    want_adv = np_gae_skipping(R, v, m, 0.9, 0.8)
    want_ret = (np_gae_skipping(R, v, m, 0.9, 0.95) + v) * m
    np.testing.assert_allclose(np.asarray(out.advantages), want_adv, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(np.asarray(cb.returns), want_ret, rtol=1e-4, atol=1e-5)
