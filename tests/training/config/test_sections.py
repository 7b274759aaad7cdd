"""The sections that stand on their own: their own validators (the key they name) and properties."""

import pydantic
import pytest

from dapo_jax.training.config.sections import CriticSection, LoRASection, OptimSection, TrainSection


def _keyed(cls, **fields):
    """The key a section's validator names (its KeyedError, as pydantic wraps it)."""
    with pytest.raises(pydantic.ValidationError) as info:
        cls(**fields)
    return info.value.errors()[0]["ctx"]["error"].key


def test_lora_refuses_a_projection_named_twice():
    assert _keyed(LoRASection, targets=["q_proj", "v_proj", "q_proj"]) == "targets"
    assert LoRASection(targets=["q_proj"]).targets == ["q_proj"]
    with pytest.raises(pydantic.ValidationError):
        LoRASection(targets=[])


def test_stop_at_accuracy_needs_evaluations_and_loggers_default_to_tensorboard():
    with pytest.raises(pydantic.ValidationError, match="set train.eval_every > 0"):
        TrainSection(stop_at_accuracy=0.5)
    assert TrainSection(stop_at_accuracy=0.5, eval_every=5).stop_at_accuracy == 0.5
    assert TrainSection().active_loggers == ("tensorboard",)
    assert TrainSection(tensorboard=False).active_loggers == ()
    assert TrainSection(loggers=["wandb", "tensorboard", "wandb"]).active_loggers == ("wandb", "tensorboard")


def test_the_critic_section_is_an_optimizer_section_with_a_trunk_path():
    assert set(CriticSection.model_fields) == set(OptimSection.model_fields) | {"path"}
    assert CriticSection(lr=1e-5).path is None
