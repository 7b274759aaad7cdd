"""Skywork-OR1's adaptive entropy coefficient in the trainer: α_k reaches the update as an input, the run
logs it, and a run stopped and resumed follows the uninterrupted run's α trajectory and parameters exactly."""

import jax
import numpy as np
import pytest
from flax import nnx

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.training.config.run import load_config
from dapo_jax.training.config.sections import OptimSection
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.update.train_step import init_train_state, make_optimizer, make_train_step
from tests.objectives.test_adaptive_entropy import numpy_controller
from tests.training.update.test_train_step import make_batch, tiny_model


def test_the_update_takes_alpha_as_an_input_and_subtracts_alpha_times_the_entropy():
    graphdef, _ = nnx.split(tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))
    step = make_train_step(graphdef, tx, schedule, objective=ObjectiveConfig(entropy_target=0.2), micro_batches=2)
    batch = make_batch(old_shift=0.3)
    out = {}
    for alpha in (0.0, 0.5):
        fresh = init_train_state(nnx.split(tiny_model())[1], tx)  # the state is donated
        _, out[alpha] = step(fresh, batch, entropy_coef=np.float32(alpha))
    # one mini-batch: loss(α) = pg − α·H̄, H̄ the token-mean entropy the step reports
    np.testing.assert_allclose(float(out[0.5]["loss"]) - float(out[0.0]["loss"]),
                               -0.5 * float(out[0.0]["entropy"]), rtol=1e-4)
    assert float(out[0.5]["grad_norm"]) != float(out[0.0]["grad_norm"])
    with pytest.raises(ValueError, match="entropy_coef"):
        step(init_train_state(nnx.split(tiny_model())[1], tx), batch)


EXTRA = {"objective.name": "skywork_or1", "objective.entropy_target": 100.0,  # above the tiny model's ~4.6 nats
         "objective.entropy_coef_init": 0.005, "objective.entropy_coef_delta": 0.01,
         "objective.entropy_coef_max": 0.02, "data.eval": "null", "train.steps": 4, "train.checkpoint_every": 2}


def _params(cfg, run_dir):
    from dapo_jax.training.loop import load_trained_model

    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


@pytest.mark.slow
def test_a_resumed_run_follows_the_uninterrupted_alpha_and_parameters_exactly(tiny_model_dir, tmp_path,
                                                                              overrides_for):
    from dapo_jax.training.loop import train

    resumed, straight = tmp_path / "resumed", tmp_path / "straight"
    train(load_config(None, overrides_for(tiny_model_dir, resumed, **{**EXTRA, "train.steps": 2})))
    cfg = load_config(None, overrides_for(tiny_model_dir, resumed, **EXTRA))
    train(cfg)
    train(load_config(None, overrides_for(tiny_model_dir, straight, **EXTRA)))
    rows_a = [r for r in read_metrics(resumed) if "grad_norm" in r]
    rows_b = [r for r in read_metrics(straight) if "grad_norm" in r]
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == [1, 2, 3, 4]
    for key in ("entropy_coef", "entropy_coef_next", "entropy", "loss", "reward_mean"):
        assert [r[key] for r in rows_a] == [r[key] for r in rows_b], key
    # α follows the NumPy rule on the run's own entropies: 0.005, 0.015, 0.02 (max), 0.02
    alphas = numpy_controller([r["entropy"] for r in rows_b], c0=0.005, target=100.0, delta=0.01, c_max=0.02)
    np.testing.assert_array_equal(np.float32([r["entropy_coef"] for r in rows_b]), np.float32(alphas[:4]))
    np.testing.assert_array_equal(np.float32([r["entropy_coef_next"] for r in rows_b]), np.float32(alphas[1:]))
    assert [r["entropy_coef"] for r in rows_b] == pytest.approx([0.005, 0.015, 0.02, 0.02])
    step_a, params_a = _params(cfg, resumed)
    step_b, params_b = _params(cfg, straight)
    assert step_a == step_b == 4
    for a, b in zip(params_a, params_b):
        np.testing.assert_array_equal(a, b)
