"""Drawing one token per row from full-vocabulary logits: temperature, top-k, top-p (nucleus), greedy.

Pure functions of `[B, V]` arrays, always in float32. They return both log-probs the RL loop needs:

    logprob         = log_softmax(z / tau)[token]                      the trainer's quantity
    sampled_logprob = log q(token),  q = renormalised top-k/top-p truncation of softmax(z / tau)

`sampled_logprob == logprob` when nothing is truncated; the difference is the importance weight
that corrects a truncated sampler (trl#6789).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from dapo_jax.parallel.mesh import per_batch_shard
from dapo_jax.sampling.config import SamplingConfig

_NEG_INF = -jnp.inf


def tempered_logprobs(logits: jax.Array, *, temperature: float) -> jax.Array:
    """`log_softmax(logits / temperature)` in float32, `[..., V]`."""
    return jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)


# top-p looks for the nucleus among this many most likely tokens (`lax.top_k`) first: a language
# model's nucleus is usually a few to a few hundred tokens. When it is wider, a bisection over the
# whole vocabulary finds it.
_CANDIDATES = 256
# top-k up to this k is `lax.top_k` itself (a partial sort: at V = 152k on a CPU, k = 4096 costs 8x
# k = 1 and a fifteenth of a full sort); a wider k is found by bisection.
_TOP_K_DIRECT = 4096
# On a CPU a bisection walks over the rows in blocks of at most this many entries (4 MiB of float32 for
# its two arrays) once all rows hold 4x more, so that each block stays in cache for its 32 passes
# (2.5x faster at B = 64, V = 152k). An accelerator takes all rows at once.
_BLOCK_ENTRIES = 2**19


def truncation_mask(logprobs: jax.Array, *, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """Which tokens may be sampled, `[..., V]` bool (computed in float32).

    top-k keeps the `k` largest (ties at the k-th value are all kept, as transformers does). top-p then
    works on the top-k distribution renormalised: sort descending, keep token i while the
    probability mass *before* it is < `top_p` (the smallest prefix with mass >= `top_p`; the first
    token is always kept). Implemented as a threshold on the value, so tokens tied with the last
    kept one are kept too: token i is kept iff the mass of the tokens strictly more likely than it
    is < `top_p`.

    No path sorts the whole vocabulary (at V = 152k an XLA:CPU sort costs over 10x a plain draw):
    - top-k up to `_TOP_K_DIRECT` is `lax.top_k(k)`, then the rule above on those k values;
    - top-p with no (or a wider) top-k first applies the rule to the `_CANDIDATES` most likely tokens,
      with the softmax denominator summed over the vocabulary; that is the answer whenever the mass
      before the last candidate already reaches `top_p`, as in a peaked distribution;
    - otherwise (a flat distribution) a bisection over float32 values finds the smallest threshold
      t with `mass(logprobs > t) < top_p`, at most 32 passes over the vocabulary; a wider top-k's
      k-th value is found the same way by counting.
    The kept set is the sorted filter's (`_truncation_mask_sorted`) except where a token's mass
    before it lies within float32 rounding (~1e-7) of `top_p`: the sums run in another order.
    """
    logprobs = logprobs.astype(jnp.float32)
    vocab = logprobs.shape[-1]
    k = vocab if top_k <= 0 else min(top_k, vocab)
    if k == vocab and top_p >= 1.0:
        return jnp.ones(logprobs.shape, bool)
    if (k < vocab and k <= _TOP_K_DIRECT) or vocab <= _CANDIDATES:
        values, _ = jax.lax.top_k(logprobs, k)  # the reference's own path, a partial sort (k < V)
        return logprobs >= _kept_floor(values, top_p)
    return _wide_truncation_mask(logprobs, k, top_p)


def _kept_floor(values: jax.Array, top_p: float) -> jax.Array:
    """The smallest kept value `[..., 1]` of the descending `values [..., k]` (the top-k, renormalised)."""
    if top_p >= 1.0:
        # a min over all k, not `values[..., -1:]`: XLA turns a top_k read only at its last entry
        # into a full sort
        return jnp.min(values, axis=-1, keepdims=True)
    keep = _nucleus_prefix(jax.nn.softmax(values, axis=-1), top_p)
    return jnp.min(jnp.where(keep, values, jnp.inf), axis=-1, keepdims=True)


def _nucleus_prefix(probs: jax.Array, top_p: float) -> jax.Array:
    """`[..., n]` bool: the mass before each of the descending `probs` is < `top_p`."""
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    return mass_before < top_p


def _wide_truncation_mask(logprobs: jax.Array, k: int, top_p: float) -> jax.Array:
    """`truncation_mask` without sorting V, for a wide top-k (`k > _TOP_K_DIRECT`) or none (`k == V`)."""
    vocab = logprobs.shape[-1]
    top = jnp.max(logprobs, axis=-1, keepdims=True)
    weight = lambda x: jnp.exp(x - top)  # the reference softmax's numerators, token by token
    if k < vocab:
        kth = _in_row_blocks(lambda x: _kth_largest(x, k), logprobs)
        if top_p >= 1.0:
            return logprobs >= kth
        above = logprobs > kth
        # the reference normalises over exactly k values: the ones above the k-th and enough ties
        ties = k - jnp.sum(above, axis=-1, keepdims=True)
        norm = jnp.sum(jnp.where(above, weight(logprobs), 0.0), axis=-1, keepdims=True) + ties * weight(kth)
    else:
        kth = jnp.full_like(top, -jnp.inf)
        norm = jnp.sum(weight(logprobs), axis=-1, keepdims=True)
    cand, _ = jax.lax.top_k(logprobs, min(_CANDIDATES, k))  # all inside the top-k
    keep = _nucleus_prefix(weight(cand) / norm, top_p)
    floor = jnp.min(jnp.where(keep, cand, jnp.inf), axis=-1, keepdims=True)
    # the mass before the last candidate already reaches top_p: the nucleus ends among the candidates
    inside = ~keep[..., -1:]

    def bisect():  # every row, for simplicity; each row's answer does not depend on the others
        nucleus = lambda x, p: _nucleus_floor(x, p, top_p)
        return jnp.where(inside, floor, _in_row_blocks(nucleus, logprobs, weight(logprobs) / norm))

    floor = jax.lax.cond(jnp.all(inside), lambda: floor, bisect)
    return logprobs >= jnp.maximum(floor, kth)


def _in_row_blocks(fn, *arrays: jax.Array) -> jax.Array:
    """`fn(*arrays) -> [..., 1]` for arrays `[..., V]`, walking over blocks of consecutive rows with
    `lax.map` when they are large, on a CPU (see `_BLOCK_ENTRIES`)."""
    shape = arrays[0].shape
    vocab, rows = shape[-1], math.prod(shape[:-1])
    if rows * vocab <= 4 * _BLOCK_ENTRIES or jax.default_backend() != "cpu":
        return fn(*arrays)
    per_block = max([d for d in range(1, rows + 1) if rows % d == 0 and d * vocab <= _BLOCK_ENTRIES] or [1])
    blocks = tuple(a.reshape(rows // per_block, per_block, vocab) for a in arrays)
    return jax.lax.map(lambda xs: fn(*xs), blocks).reshape(*shape[:-1], 1)


def _order_key(x: jax.Array) -> jax.Array:
    """float32 -> int32 with the same order (-0.0 just below +0.0); its own inverse."""
    bits = jax.lax.bitcast_convert_type(x, jnp.int32)
    return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _key_value(key: jax.Array) -> jax.Array:
    return jax.lax.bitcast_convert_type(key ^ ((key >> 31) & 0x7FFFFFFF), jnp.float32)


def _bisect(lo: jax.Array, hi: jax.Array, is_high) -> tuple[jax.Array, jax.Array]:
    """Narrows int32 keys `lo < hi` (`is_high(lo)` false or never asked, `is_high(hi)` true; `is_high`
    monotone in the value) to `hi == lo + 1`: `hi` is then the smallest key with `is_high`. At most
    32 steps, one pass over the vocabulary each."""

    def step(bounds):
        lo, hi = bounds
        mid = (lo >> 1) + (hi >> 1) + (lo & hi & 1)  # floor((lo + hi) / 2) without int32 overflow
        open_ = hi > lo + 1
        high = is_high(_key_value(mid))
        return jnp.where(open_ & ~high, mid, lo), jnp.where(open_ & high, mid, hi)

    return jax.lax.while_loop(lambda bounds: jnp.any(bounds[1] > bounds[0] + 1), step, (lo, hi))


def _kth_largest(logprobs: jax.Array, k: int) -> jax.Array:
    """The k-th largest value `[..., 1]`: the largest t with `count(logprobs >= t) >= k`."""
    lo = _order_key(jnp.min(logprobs, axis=-1, keepdims=True))  # count = V >= k
    hi = _order_key(jnp.max(logprobs, axis=-1, keepdims=True)) + 1  # count = 0 < k
    lo, _ = _bisect(lo, hi, lambda t: jnp.sum(logprobs >= t, axis=-1, keepdims=True) < k)
    return _key_value(lo)


def _nucleus_floor(logprobs: jax.Array, probs: jax.Array, top_p: float) -> jax.Array:
    """The smallest float32 t `[..., 1]` with `sum(probs[logprobs > t]) < top_p`: token i is kept iff
    `logprobs[i] >= t`. A masked sum in a fixed order is monotone in t, so bisection is exact."""
    # below every token that has mass (never asked); zero-mass tokens (-inf) would widen the search
    lo = _order_key(jnp.min(jnp.where(probs > 0, logprobs, jnp.inf), axis=-1, keepdims=True)) - 1
    hi = _order_key(jnp.max(logprobs, axis=-1, keepdims=True))  # nothing above it: mass 0 < top_p
    _, hi = _bisect(lo, hi, lambda t: jnp.sum(jnp.where(logprobs > t, probs, 0.0), axis=-1, keepdims=True) < top_p)
    return _key_value(hi)


def _truncation_mask_sorted(logprobs: jax.Array, *, top_k: int = 0, top_p: float = 1.0) -> jax.Array:
    """The previous `truncation_mask`, which sorts the whole vocabulary when top_k is off: the
    reference that tests and `benchmarks/topp.py` compare against. Not used by the sampler."""
    vocab = logprobs.shape[-1]
    k = vocab if top_k <= 0 else min(top_k, vocab)
    if k == vocab and top_p >= 1.0:
        return jnp.ones(logprobs.shape, bool)
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
        def truncated(uniform, shifted):
            logp = shifted - jnp.log(jnp.sum(jnp.exp(shifted), axis=-1, keepdims=True))
            keep = truncation_mask(logp, top_k=config.top_k, top_p=config.top_p)
            q = jax.nn.log_softmax(jnp.where(keep, logp, _NEG_INF), axis=-1)
            tokens = _inverse_cdf(uniform, jnp.exp(q))
            return tokens, _pick(logp, tokens), _pick(q, tokens)

        # on each batch device's own rows: `lax.top_k` over a batch split across devices would
        # otherwise gather every row's logits onto every device at every step
        return per_batch_shard(truncated, uniform, shifted)
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
