"""EDGE-GRPO's Entropy-Driven Advantage in the jitted update: its normaliser N is taken over the whole
update batch, so the update does not change with micro_batches and equals a plain jax.grad of the
whole-batch loss with NumPy-scaled advantages; and two steps of the `edge_grpo` recipe end to end."""


import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.models.logprobs import response_logprobs
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.training.config.sections import OptimSection
from dapo_jax.training.update.train_step import init_train_state, make_optimizer, make_train_step
from tests.training.update.test_train_step import leaves, make_batch, tiny_model


def test_entropy_driven_advantage_is_taken_over_the_whole_update_batch():
    objective = ObjectiveConfig(entropy_driven_advantage=True, eps_low=0.2, eps_high=0.28)
    temp = 0.1  # sharpens the tiny model's near-uniform next-token distributions: P̄ varies by ~2%, not 0.01%
    batch = make_batch(seed=5, old_shift=0.3)
    graphdef, params = nnx.split(tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))
    got = {}
    for micro in (1, 4):
        step = make_train_step(graphdef, tx, schedule, objective=objective, micro_batches=micro, temperature=temp)
        state, metrics = step(init_train_state(nnx.split(tiny_model())[1], tx), batch)
        got[micro] = (float(metrics["grad_norm"]), float(metrics["loss"]), leaves(state.params))

    # reference: the whole batch's entropies, P̄ and N in float64 NumPy, then the clipped surrogate's
    # token mean with the scaled (constant) advantages, differentiated by plain jax.grad
    model = nnx.merge(graphdef, params)
    mask = np.asarray(batch.response_mask, np.float64)
    _, entropy = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                   batch.response_mask, temperature=temp)
    entropy = np.asarray(entropy, np.float64)
    p_bar = (entropy * mask).sum(-1) / mask.sum(-1)
    norm = p_bar.mean()  # make_batch gives every response at least one token
    scaled = np.asarray(batch.advantages, np.float64)[..., 0] * norm / p_bar
    assert p_bar.std() > 0.02  # the scale really varies between responses

    def loss(params, adv_seq):
        adv = jnp.asarray(np.broadcast_to(adv_seq[..., None], mask.shape), jnp.float32)
        logp, _ = response_logprobs(nnx.merge(graphdef, params), batch.prompt_ids, batch.prompt_mask,
                                    batch.response_ids, batch.response_mask, temperature=temp)
        ratio = jnp.exp(logp - batch.old_logp)
        ell = -jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.28) * adv)
        return jnp.sum(ell * batch.response_mask) / jnp.sum(batch.response_mask)

    value, grads = jax.value_and_grad(loss)(params, scaled)
    # the unscaled (plain GRPO) update is measurably different, so the comparison below can fail
    plain = jax.grad(loss)(params, np.asarray(batch.advantages, np.float64)[..., 0])
    diff = jax.tree.map(jnp.subtract, plain, grads)
    assert float(optax.tree.norm(diff)) / float(optax.tree.norm(grads)) > 1e-3
    for micro, (grad_norm, loss_value, new_params) in got.items():
        np.testing.assert_allclose(loss_value, float(value), rtol=1e-4, err_msg=f"micro_batches={micro}")
        np.testing.assert_allclose(grad_norm, float(optax.tree.norm(grads)), rtol=1e-4, err_msg=f"micro_batches={micro}")
        for a, b in zip(new_params, got[1][2]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"micro_batches={micro}")


@pytest.mark.slow
def test_two_steps_of_the_edge_grpo_recipe(tmp_path):
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import train
    from tests.training.conftest import finite_step_rows

    cfg = load_config(None, [
        "objective.name=edge_grpo", f"train.run_dir={tmp_path / 'run'}",
        "train.steps=2", "rollout.G=4", "rollout.train_batch=4", "rollout.gen_batch=8", "rollout.max_gen_batches=2",
        "data.eval_size=16", "optim.num_minibatches=1", "optim.micro_batches=2", "train.eval_k=2",
        "train.checkpoint_every=0", "train.eval_every=0", "train.rollouts_every=0", "train.progress=false",
        "train.tensorboard=false",
    ])
    assert cfg.objective_config.entropy_driven_advantage
    train(cfg)
    finite_step_rows(tmp_path / "run", ("loss", "grad_norm", "entropy", "advantage_mean"), steps=2)
