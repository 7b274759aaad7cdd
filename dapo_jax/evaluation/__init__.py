"""Evaluation: avg@k, unbiased pass@k, maj@k (`metrics`); `dapo-jax eval` lives in `run`, `sets` and `report`
(imported on use: they pull in the training stack)."""

from dapo_jax.evaluation.metrics import avg_at_k, maj_at_k, majority_index, pass_at_k, summarize

__all__ = ["avg_at_k", "maj_at_k", "majority_index", "pass_at_k", "summarize"]
