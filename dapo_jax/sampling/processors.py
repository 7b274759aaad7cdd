"""Drawing one token per row from full-vocabulary logits: temperature, top-k, top-p (nucleus), greedy.

Pure functions of `[B, V]` arrays, always in float32. They return both log-probs the RL loop needs:

    logprob         = log_softmax(z / tau)[token]                      the trainer's quantity
    sampled_logprob = log q(token),  q = renormalised top-k/top-p truncation of softmax(z / tau)

`sampled_logprob == logprob` when nothing is truncated; the difference is the importance weight
that corrects a truncated sampler (trl#6789).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.sampling.config import SamplingConfig

_NEG_INF = -jnp.inf


def tempered_logprobs(logits: jax.Array, *, temperature: float) -> jax.Array:
    """`log_softmax(logits / temperature)` in float32, `[..., V]`."""
    return jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)


def truncation_mask(logprobs: jax.Array, *, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """Which tokens may be sampled, `[..., V]` bool.

    top-k keeps the `k` largest (ties at the k-th value are all kept, as transformers does). top-p then
    works on the top-k distribution renormalised: sort descending, keep token i while the
    probability mass *before* it is < `top_p` (the smallest prefix with mass >= `top_p`; the first
    token is always kept). Implemented as a threshold on the value, so tokens tied with the last
    kept one are kept too.
    """
    vocab = logprobs.shape[-1]
    k = vocab if top_k <= 0 else min(top_k, vocab)
    if k == vocab and top_p >= 1.0:
        return jnp.ones(logprobs.shape, bool)
    # top_k with k == V is a full descending sort; with k < V it never sorts the whole vocabulary.
    values, _ = jax.lax.top_k(logprobs, k)  # [..., k] descending
    if top_p < 1.0:
        probs = jax.nn.softmax(values, axis=-1)  # renormalised over the top-k
        mass_before = jnp.cumsum(probs, axis=-1) - probs
        keep = mass_before < top_p
        # keep is a prefix, so its last True value is the threshold
        threshold = jnp.min(jnp.where(keep, values, jnp.inf), axis=-1, keepdims=True)
    else:
        threshold = values[..., -1:]
    return logprobs >= threshold


def _inverse_cdf(uniform: jax.Array, weights: jax.Array) -> jax.Array:
    """`[B]` indices with probability ∝ `weights [B, V]` (>= 0, zero entries never drawn), from one
    uniform per row (not V Gumbels: generating B*V random bits each step costs more than the tiny
    models' forward pass on CPU)."""
    cdf = jnp.cumsum(weights, axis=-1)
    total = cdf[..., -1:]
    # x < total strictly, so the first index with cdf > x has positive weight (never a masked token)
    x = jnp.minimum(uniform[:, None] * total, jnp.nextafter(total, jnp.zeros_like(total)))
    return jnp.sum(cdf <= x, axis=-1).astype(jnp.int32)


def _pick(x: jax.Array, tokens: jax.Array) -> jax.Array:
    return jnp.take_along_axis(x, tokens[:, None], axis=-1)[:, 0]


def draw_tokens(
    uniform: jax.Array, logits: jax.Array, *, config: SamplingConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`sample_tokens` given its randomness: `uniform [B]` in [0, 1), one per row.

    The rollout draws every step's uniforms up front, so the decode loop runs no PRNG. Without
    truncation it exponentiates the logits once: `w = exp(z/tau - max)`, `logprob = log w[token] -
    log sum(w)`, the same float32 math as `log_softmax`.
    """
    if config.is_greedy:
        return sample_tokens(None, logits, config=config)
    z = logits.astype(jnp.float32) / config.logprob_temperature
    shifted = z - jnp.max(z, axis=-1, keepdims=True)
    if config.truncates:
        logp = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))
        keep = truncation_mask(logp, top_k=config.top_k, top_p=config.top_p)
        q = jax.nn.log_softmax(jnp.where(keep, logp, _NEG_INF), axis=-1)
        tokens = _inverse_cdf(uniform, jnp.exp(q))
        return tokens, _pick(logp, tokens), _pick(q, tokens)
    weights = jnp.exp(shifted)
    tokens = _inverse_cdf(uniform, weights)
    picked = _pick(shifted, tokens) - jnp.log(jnp.sum(weights, axis=-1))
    return tokens, picked, picked


def sample_tokens(
    key: jax.Array | None, logits: jax.Array, *, config: SamplingConfig
) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Draws one token per row.

    Args:
      key: PRNG key (unused when greedy).
      logits: `[B, V]`, any float dtype.
      config: temperature / top_k / top_p / greedy.

    Returns:
      tokens `[B]` int32, logprob `[B]` = log_softmax(logits/tau)[token] (tau = 1 if greedy with
      temperature 0), sampled_logprob `[B]` = log q(token) under the distribution actually sampled
      (0 when greedy: a point mass).
    """
    if config.is_greedy:
        logp = tempered_logprobs(logits, temperature=config.logprob_temperature)
        tokens = jnp.argmax(logits, axis=-1).astype(jnp.int32)
        picked = _pick(logp, tokens)
        return tokens, picked, jnp.zeros_like(picked)
    uniform = jax.random.uniform(key, logits.shape[:1], jnp.float32)
    return draw_tokens(uniform, logits, config=config)
