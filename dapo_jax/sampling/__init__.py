"""Rollout sampling: a KV-cached, jit-compiled sampler that returns fixed-shape `[P, G, T]` rollouts."""

from dapo_jax.sampling.buckets import pad_to_bucket
from dapo_jax.sampling.config import SamplingConfig, SamplingConfigError
from dapo_jax.sampling.continuous import ContinuousSampler
from dapo_jax.sampling.processors import sample_tokens, tempered_logprobs, truncation_mask
from dapo_jax.sampling.sampler import Rollout, generate, make_generate, rollout_with_steps

__all__ = [
    "ContinuousSampler",
    "Rollout",
    "SamplingConfig",
    "SamplingConfigError",
    "generate",
    "make_generate",
    "pad_to_bucket",
    "rollout_with_steps",
    "sample_tokens",
    "tempered_logprobs",
    "truncation_mask",
]
