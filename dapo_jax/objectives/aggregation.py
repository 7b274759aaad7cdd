"""Aggregating per-token losses ℓ[P, G, T] into a (loss_sum, denominator) pair (docs/objectives.md#aggregation).

Each mode returns the PAIR, never the ratio: the trainer adds the pairs of all micro-batches (and
devices) and divides once, which gives exactly the whole-batch loss and gradient by construction
(the TRL #5619 / verl #5625 bug cannot happen). The ratio of one pair is that batch's loss.

    token_mean           (Σ ℓ·m,                 Σ m)
    seq_mean_token_mean  (Σ_i Σ_t ℓ·m / L_i,     #responses with L_i > 0)
    seq_mean_token_sum   (Σ_i Σ_t ℓ·m,           #responses with L_i > 0)
    group_mean_token_mean (Σ_p Σ_{i∈p} Σ_t ℓ·m / Σ_{i∈p} L_i,  #groups with Σ L_i > 0)   (DAPO's Eq. 8)
    constant_norm        (Σ ℓ·m,                 #responses with L_i > 0 · T_max)   (Dr. GRPO)

A response whose mask is all zero (padding, overlong-filtered, dropped) is left out of the loss and
of every denominator. Shared signature: fn(loss, mask, *, max_response_length=None) -> (sum, den),
scalars float32.
"""

from __future__ import annotations

import jax.numpy as jnp


def _prep(loss, mask):
    m = jnp.asarray(mask, jnp.float32)
    # where, not a product: a NaN/inf loss on padding must not leak into the sum.
    return jnp.where(m > 0, jnp.asarray(loss, jnp.float32) * m, 0.0), m


def _n_responses(m):
    return jnp.sum((jnp.sum(m, axis=-1) > 0).astype(jnp.float32))


def token_mean(loss, mask, *, max_response_length=None):
    """`(Σ ℓ·m, Σ m)`: the token-level loss of DAPO / verl `token-mean` / TRL `dapo`."""
    del max_response_length
    lm, m = _prep(loss, mask)
    return jnp.sum(lm), jnp.sum(m)


def seq_mean_token_mean(loss, mask, *, max_response_length=None):
    """`(Σ_i Σ_t ℓ·m / L_i, #non-empty responses)`: the original GRPO loss."""
    del max_response_length
    lm, m = _prep(loss, mask)
    per_response = jnp.sum(lm, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)
    return jnp.sum(per_response), _n_responses(m)


def seq_mean_token_sum(loss, mask, *, max_response_length=None):
    """`(Σ_i Σ_t ℓ·m, #non-empty responses)`."""
    del max_response_length
    lm, m = _prep(loss, mask)
    return jnp.sum(lm), _n_responses(m)


def group_mean_token_mean(loss, mask, *, max_response_length=None):
    """`(Σ_p Σ_{i,t} ℓ·m / Σ_{i,t} m, #non-empty groups)`: the token-level loss as DAPO's Eq. 8 writes it,
    normalised by the tokens of each prompt's group of `G` responses, then averaged over prompts.

    Needs the `[P, G, T]` layout: a group is the second axis. Micro-batches and packed chunks hold whole
    groups (they split the prompt axis), so their pairs still add up to the whole batch's."""
    del max_response_length
    lm, m = _prep(loss, mask)
    group_tokens = jnp.sum(m, axis=(-2, -1))
    per_group = jnp.sum(lm, axis=(-2, -1)) / jnp.maximum(group_tokens, 1.0)
    return jnp.sum(per_group), jnp.sum((group_tokens > 0).astype(jnp.float32))


def constant_norm(loss, mask, *, max_response_length=None):
    """`(Σ ℓ·m, #non-empty responses · T_max)`: Dr. GRPO's length-unbiased constant normaliser."""
    if max_response_length is None:
        raise ValueError("loss_agg='constant_norm' needs max_response_length (T_max) set in the ObjectiveConfig")
    lm, m = _prep(loss, mask)
    return jnp.sum(lm), _n_responses(m) * float(max_response_length)
