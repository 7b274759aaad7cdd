"""The decoder (Qwen2/2.5, Qwen3, Llama 3), its one-token decode step over a KV cache, its config, Hugging Face checkpoint I/O and sharding rules."""

from dapo_jax.models.classifier import Classifier
from dapo_jax.models.config import ModelConfig, ModelConfigError, RopeScaling
from dapo_jax.models.decoder import Decoder, KVCache, positions_from_mask
from dapo_jax.models.generation_config import GenerationConfig, load_generation_config, stop_token_ids
from dapo_jax.models.hf_classifier_io import load_classifier, save_classifier
from dapo_jax.models.hf_io import load_model_and_tokenizer, load_pretrained, load_tokenizer, save_pretrained
from dapo_jax.models.safetensors_files import CheckpointError
from dapo_jax.models.sharding import (
    PARTITION_RULES,
    check_divisible,
    constrain_batch,
    param_partition_specs,
    param_shardings,
    shard_model,
)

__all__ = [
    "PARTITION_RULES",
    "CheckpointError",
    "Classifier",
    "Decoder",
    "GenerationConfig",
    "KVCache",
    "ModelConfig",
    "ModelConfigError",
    "RopeScaling",
    "check_divisible",
    "constrain_batch",
    "load_classifier",
    "load_generation_config",
    "load_model_and_tokenizer",
    "load_pretrained",
    "load_tokenizer",
    "param_partition_specs",
    "param_shardings",
    "positions_from_mask",
    "save_classifier",
    "save_pretrained",
    "shard_model",
    "stop_token_ids",
]
