"""Episodes in the update: advantages against NumPy references, overlong shaping on model ids, and a
train step that attends to tool ids but takes no loss on them."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.agents.update import episode_batch
from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.update.train_step import init_train_state, make_train_step
from tests.agents.helpers import random_decoder

# two groups of two episodes, T = 8: m = model id, o = observation id
#   episode 0: m m o o m m . .   turns end at 1, 5; turn rewards 1, 0
#   episode 1: m m m m m m m m   one turn (ends at 7), truncated by the budget
#   episode 2: m o m . . . . .   turns end at 0, 2; turn rewards 0, 2
#   episode 3: m m . . . . . .   one turn ends at 1
LOSS = np.array([[1, 1, 0, 0, 1, 1, 0, 0], [1] * 8, [1, 0, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]], np.float32)
CONTEXT = np.array([[1, 1, 1, 1, 1, 1, 0, 0], [1] * 8, [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 0, 0, 0, 0, 0, 0]], np.float32)


def arrays(seed=0):
    rng = np.random.default_rng(seed)
    return {
        "prompt_ids": np.array([[0, 5, 6]] * 2 + [[7, 8, 9]] * 2, np.int32),
        "prompt_mask": np.array([[0, 1, 1]] * 2 + [[1, 1, 1]] * 2, np.int32),
        "response_ids": (rng.integers(2, 24, (4, 8)) * CONTEXT).astype(np.int32),
        "context_mask": CONTEXT, "loss_mask": LOSS,
        "logp": (-rng.uniform(0.5, 3.0, (4, 8)) * LOSS).astype(np.float32),
        "entropy": np.zeros((4, 8), np.float32),
        "step_rewards": np.array([[1, 0], [0, 0], [0, 2], [0, 0]], np.float32),
        "step_ends": np.array([[1, 5], [7, 0], [0, 2], [1, 0]], np.int32),
        "step_mask": np.array([[1, 1], [1, 0], [1, 1], [1, 0]], np.float32),
        "model_tokens": LOSS.sum(1).astype(np.int32), "truncated": np.array([0, 1, 0, 0], bool),
        "num_turns": np.array([2, 1, 2, 1], np.int32),
    }


def test_outcome_advantages_on_model_ids_only():
    obj = load_objective("grpo")
    rewards = np.array([1.0, 0.0, 0.0, 0.0])
    out = episode_batch(arrays(), rewards, objective=obj, group_size=2)
    r = rewards.reshape(2, 2)
    std = r.std(axis=1, ddof=1 if obj.std_unbiased else 0)
    want = (r - r.mean(1, keepdims=True)) / (std[:, None] + obj.std_eps)
    adv = np.asarray(out.batch.advantages).reshape(4, 8)
    np.testing.assert_allclose(adv, want.reshape(4)[:, None] * LOSS, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(np.asarray(out.batch.response_mask).reshape(4, 8), LOSS)
    np.testing.assert_array_equal(np.asarray(out.batch.context_mask).reshape(4, 8), CONTEXT)
    np.testing.assert_array_equal(np.asarray(out.batch.prompt_ids), [[0, 5, 6], [7, 8, 9]])


@pytest.mark.parametrize("gamma", [1.0, 0.5])
def test_turn_rewards_through_process_supervision(gamma):
    # agent.discount γ: turn k weighs γ^(k − j) from a model id of turn j; the outcome sits on the last turn
    obj = load_objective("grpo_process", process_discount=gamma)
    outcome = np.array([1.0, 0.0, 3.0, 0.0])
    out = episode_batch(arrays(), outcome, objective=obj, group_size=2)
    a = arrays()
    want = np.zeros((4, 8))
    for p in range(2):  # normalise the steps of the group, outcome on each episode's last turn
        rows = [2 * p, 2 * p + 1]
        steps = []
        for b in rows:
            r = a["step_rewards"][b, :a["num_turns"][b]].astype(np.float64).copy()
            r[-1] += outcome[b]
            steps.append(r)
        flat = np.concatenate(steps)
        mean, std = flat.mean(), flat.std(ddof=1)
        for b, r in zip(rows, steps):
            for t in range(8):
                ends = a["step_ends"][b, :len(r)]
                j = int(np.sum(ends < t))  # the turn of id t (each turn ends at its own id)
                want[b, t] = sum(gamma ** (k - j) * (rj - mean) / (std + obj.std_eps)
                                 for k, (rj, e) in enumerate(zip(r, ends)) if e >= t) * LOSS[b, t]
    np.testing.assert_allclose(np.asarray(out.batch.advantages).reshape(4, 8), want, rtol=1e-5, atol=1e-5)


def test_overlong_shaping_counts_model_ids_and_dynamic_sampling_judges_groups():
    obj = load_objective("dapo", overlong_buffer=2, max_response_length=7, dynamic_sampling=True,
                         overlong_filtering=True)
    rewards = np.array([1.0, 1.0, 1.0, 0.0])
    out = episode_batch(arrays(), rewards, objective=obj, group_size=2, correct=rewards.astype(bool))
    # model ids 4, 8, 2, 2 against L_max 7, L_cache 2: penalties 0, -1, 0, 0 (episode 0 has 6 ids, 4 of them
    # the model's: counting every id it would be (5 - 6) / 2)
    np.testing.assert_allclose(np.asarray(out.rewards), [[1.0, 0.0], [1.0, 0.0]])
    # overlong filtering drops the truncated episode's ids from the loss, and only its
    np.testing.assert_array_equal(np.asarray(out.batch.response_mask).reshape(4, 8), LOSS * [[1], [0], [1], [1]])
    assert out.keep.tolist() == [False, True]  # group 0 is all correct


@pytest.fixture(scope="module")
def stepped():
    model = random_decoder()
    graphdef, state = nnx.split(model)
    obj = load_objective("grpo", kl_beta=0.0)
    tx = optax.sgd(0.5)
    step = make_train_step(graphdef, tx, optax.constant_schedule(0.5), objective=obj)

    def run(batch):
        new, _ = step(init_train_state(jax.tree.map(jnp.copy, state), tx), batch)
        return new.params

    return obj, run


def test_tool_ids_are_context_without_loss(stepped):
    obj, run = stepped
    a = arrays()
    base = episode_batch(a, np.array([1.0, 0.0, 0.0, 1.0]), objective=obj, group_size=2).batch
    first = run(base)
    # other old log-probs and advantages on observation ids: the same update
    obs = jnp.asarray((CONTEXT - LOSS).reshape(2, 2, 8))
    noisy = base._replace(old_logp=base.old_logp - 3.0 * obs, advantages=base.advantages + 5.0 * obs)
    same = run(noisy)
    for x, y in zip(jax.tree.leaves(first), jax.tree.leaves(same)):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))
    # observation ids removed from the context: a different update (the model attended to them)
    blind = run(base._replace(context_mask=base.response_mask))
    assert any(np.abs(np.asarray(x) - np.asarray(y)).max() > 1e-6
               for x, y in zip(jax.tree.leaves(first), jax.tree.leaves(blind)))


def episodes(obj, rewards):
    """Four groups of two episodes (`arrays` of two seeds): the model's ids between tool ids."""
    a, b = arrays(0), arrays(1)
    return episode_batch({k: np.concatenate([a[k], b[k]]) for k in a}, rewards, objective=obj, group_size=2).batch


PACKED = [  # (recipe, overrides, num_minibatches, micro_batches)
    ("grpo", {"kl_beta": 0.0}, 1, 1),
    ("grpo", {"kl_beta": 0.0}, 1, 2),
    # the truncated episodes' model ids leave the loss (overlong filtering): context with no loss at all;
    # batch-level entropy statistics from the no-gradient pass, an entropy bonus
    ("dapo", {"overlong_buffer": 2, "max_response_length": 7, "overlong_filtering": True,
              "dynamic_sampling": False, "high_entropy_quantile": 0.5, "entropy_coef": 0.01}, 2, 2),
]


@pytest.mark.parametrize("name,overrides,n,m", PACKED, ids=[f"{c[0]}-{c[2]}x{c[3]}" for c in PACKED])
def test_the_packed_update_trains_episodes_as_the_unpacked(name, overrides, n, m):
    """Tool ids are in the packed rows (the forward attends to them) and out of the loss: the same loss,
    metrics and gradient (sgd(1): new params = params - grad) as the unpacked update."""
    from dapo_jax.training.update.packed_step import PackedUpdate

    obj = load_objective(name, **overrides)
    batch = episodes(obj, np.array([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0]))
    graphdef, params = nnx.split(random_decoder())
    tx, schedule = optax.sgd(1.0), optax.constant_schedule(1.0)
    kw = dict(objective=obj, num_minibatches=n, micro_batches=m)
    unpacked = make_train_step(graphdef, tx, schedule, **kw)
    packed = PackedUpdate(graphdef, tx, schedule, chunk_rows=2, **kw)  # a chunk per group
    state_u, met_u = unpacked(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
    state_p, met_p = packed(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
    assert sorted(met_u) == sorted(met_p)
    for k in met_u:
        np.testing.assert_allclose(np.asarray(met_p[k]), np.asarray(met_u[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    assert float(met_u["update_applied"]) == 1.0 and float(met_u["loss"]) != 0.0
    assert float(met_p["update_tokens"]) == float(np.asarray(batch.response_mask).sum())  # model ids only
    for a, b in zip(jax.tree.leaves(state_u.params), jax.tree.leaves(state_p.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-6)
    # every id of an episode's context is laid out: its prompt's and its context mask's (tool ids included)
    ctx = np.asarray(batch.context_mask).sum(-1)
    want = int(((np.asarray(batch.prompt_mask).sum(-1)[:, None] + ctx) * (ctx > 0)).sum())
    assert packed.packing_stats(batch)["real_tokens"] == want > int(np.asarray(batch.response_mask).sum())
