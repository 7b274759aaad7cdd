"""EDGE-GRPO's Entropy-Driven Advantage (EDA; arXiv 2507.21848, docs/grpo_variants.md).

Each response's advantage is divided by its normalised mean token entropy:

    P̄_i = Σ_t m·H_t / L_i                           (the response's mean entropy, padding excluded)
    N   = mean of P̄_j over the non-empty responses j of the whole update batch
    Â_i = A_i · N / max(P̄_i, eps)                    (a constant: no gradient flows through it)

so that, inside a group, a confident (low-entropy) correct response gets a larger push than an
uncertain one, and a confident wrong one a larger penalty. `N` is a batch-level statistic: the trainer
takes it over every micro-batch of the update (`training/update/train_step.py`, one extra forward pass, as
for the high-entropy quantile), so the update does not depend on `micro_batches` or the mesh.
A zero advantage stays exactly zero (zero-spread groups carry no signal, whatever the entropy).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def response_entropy(entropy, mask):
    """P̄ = Σ_t m·H / L per response, `[..., T] -> [...]`; 0 for an empty response (and no NaN from padding)."""
    m = jnp.asarray(mask, jnp.float32)
    h = jnp.where(m > 0, jnp.asarray(entropy, jnp.float32), 0.0)
    return jnp.sum(h * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def entropy_normaliser(entropy, mask):
    """N = mean of P̄ over the non-empty responses of the arrays given (any leading shape: the trainer
    passes the whole update batch, every micro-batch stacked); 1 when no response is non-empty."""
    m = jnp.asarray(mask, jnp.float32)
    nonempty = (jnp.sum(m, axis=-1) > 0).astype(jnp.float32)
    count = jnp.sum(nonempty)
    total = jnp.sum(response_entropy(entropy, m) * nonempty)
    return jnp.where(count > 0, total / jnp.maximum(count, 1.0), 1.0)


def entropy_driven_advantages(advantages, entropy, mask, *, normaliser=None, eps: float = 1e-6):
    """Â = A · N / max(P̄, eps), returned with A's shape ([P, G] or [P, G, T]) and no gradient.

    Args:
      advantages: [P, G] sequence advantages, or [P, G, T] token advantages (each token's scaled by
        its response's factor).
      entropy: [P, G, T] per-token entropies of the policy being trained (detached here).
      mask: [P, G, T] response mask.
      normaliser: N taken over the whole update batch (`entropy_normaliser` of every micro-batch
        stacked); None = N of the arrays given.
      eps: floor of P̄ (a response whose every token has zero entropy would divide by zero).
    """
    h = jax.lax.stop_gradient(jnp.asarray(entropy, jnp.float32))
    m = jnp.asarray(mask, jnp.float32)
    if normaliser is None:
        normaliser = entropy_normaliser(h, m)
    scale = jax.lax.stop_gradient(normaliser) / jnp.maximum(response_entropy(h, m), eps)
    a = jnp.asarray(advantages, jnp.float32)
    if a.ndim == m.ndim:
        scale = scale[..., None]
    # where, not a product: an empty response's scale must not turn a 0 advantage into NaN
    return jax.lax.stop_gradient(jnp.where(a == 0, 0.0, a * scale))
