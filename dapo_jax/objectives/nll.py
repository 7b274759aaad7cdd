"""VAPO's positive-example LM loss (docs/objectives.md#critic-ppo-vapo, item 4), exact under micro-batching.

    L = L_PPO + μ·L_NLL,   L_NLL = -Σ_{o∈T} Σ_t log π_θ(o_t) / Σ_{o∈T} |o|

over the correct responses `T` of the optimizer batch. Its denominator differs from the policy
loss's, so it cannot ride on the (loss_sum, denominator) pair as it is. Both denominators depend
only on masks, so they are known before the update: `nll_weights` gives each token of a correct
response the weight `w = μ·D_batch / N_correct`, where `D_batch` is the policy loss's denominator
of its optimizer batch and `N_correct` that batch's correct-response token count. Then

    (Σ_micro [loss_sum + Σ_t -logp_t·w_t]) / Σ_micro den = L_PPO + μ·L_NLL

exactly, however the batch is split into micro-batches (`nll_terms` adds the second sum).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag


def nll_weights(correct, mask, batch_ids, den_per_prompt, *, coef: float, num_batches: int):
    """Per-token weights `[P, G, T]` of the NLL term.

    Args:
      correct: `[P, G]` bool/float, the responses that count (the correct ones).
      mask: `[P, G, T]` the policy loss's mask.
      batch_ids: `[P]` int, the optimizer (mini-)batch each prompt is trained in.
      den_per_prompt: `[P]` each prompt's share of the policy loss's denominator (additive).
      coef: μ; num_batches: the number of optimizer batches (static).
    """
    m = jnp.asarray(mask, jnp.float32) * jnp.asarray(correct, jnp.float32)[..., None]
    n_correct = jax.ops.segment_sum(jnp.sum(m, axis=(1, 2)), batch_ids, num_segments=num_batches)
    den = jax.ops.segment_sum(jnp.asarray(den_per_prompt, jnp.float32), batch_ids, num_segments=num_batches)
    scale = jnp.where(n_correct > 0, coef * den / jnp.maximum(n_correct, 1.0), 0.0)
    return m * scale[batch_ids][:, None, None]


def nll_terms(logp, weights):
    """`(Σ -logp·w, metrics)`: the addend of loss_sum, and the metric `nll` (mean -logp over the
    weighted tokens, as a diagnostics pair)."""
    w = jnp.asarray(weights, jnp.float32)
    lp = jnp.asarray(logp, jnp.float32)
    addend = jnp.sum(jnp.where(w > 0, -lp * w, 0.0))
    return addend, {"nll": diag.masked_sum_count(-jax.lax.stop_gradient(lp), w > 0)}
