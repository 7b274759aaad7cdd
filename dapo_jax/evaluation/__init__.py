"""Evaluation metrics: avg@k, unbiased pass@k, maj@k (`metrics`), pure NumPy over `correct[N, n]`. The
`dapo-jax eval` command that produces them is `dapo_jax.eval_command`."""

from dapo_jax.evaluation.metrics import avg_at_k, maj_at_k, majority_index, pass_at_k, summarize

__all__ = ["avg_at_k", "maj_at_k", "majority_index", "pass_at_k", "summarize"]
