"""GFPO, Group Filtered Policy Optimization (Shrivastava et al. 2025, arXiv 2508.09726; docs/objectives.md#gfpo-gdpo).

Sample `G'` responses per prompt (the rollout's `G`), train on the `k < G'` best of them by a metric,
with the advantage computed inside the kept subset `S` only:

    score[p,g]  = −L[p,g]                     metric "length": shortest first
                = r[p,g] / max(L[p,g], 1)     metric "token_efficiency": highest reward per token first
    keep[p,g]   = 1 for the k[p] highest scores of prompt p (equal scores: the lower index g first)
    A[p,g]      = (r − mean_S r) / (std_S r + eps)  on kept responses, 0 on dropped ones
    m[p,g,t]   *= keep[p,g]                   dropped responses leave the loss AND its denominator

`A` is any estimator of `advantages.py` run with `valid = keep` (GFPO's own is `grpo`): a kept subset
whose rewards are all equal gets exactly 0. `L` is the generated length in tokens (EOS included; a
truncated response counts its full `max_new_tokens`), never the mask's sum, which overlong filtering
zeroes: a filtered response would otherwise look like the shortest.

Adaptive difficulty: `k[p]` from the prompt's mean reward over all `G'` responses, bucketed by the
quartiles `q1 ≤ q2 ≤ q3` of recent prompts' mean rewards (`training/group_filter.py` keeps them):
bucket 0 (`mean ≤ q1`, the hardest) ... bucket 3 (`mean > q3`, the easiest), `k[p] = ks[bucket]`.

Everything here has fixed shapes ([P, G] in, [P, G] out) and jit-compiles; the selection is a
pairwise rank (O(G²) per prompt), so ties are broken by index exactly, with no sort.
"""

from __future__ import annotations

import jax.numpy as jnp

from dapo_jax.objectives import advantages

Array = jnp.ndarray
METRICS = ("length", "token_efficiency")


def scores(rewards: Array, lengths: Array, *, metric: str) -> Array:
    """Per-response score `[P, G]` float32, higher = kept first: `−L` ("length") or `r / max(L, 1)`
    ("token_efficiency")."""
    r = jnp.asarray(rewards, jnp.float32)
    n = jnp.asarray(lengths, jnp.float32)
    if r.shape != n.shape or r.ndim != 2:
        raise ValueError(f"rewards {r.shape} and lengths {n.shape} must both be [P, G]")
    if metric == "length":
        return -n
    if metric == "token_efficiency":
        return r / jnp.maximum(n, 1.0)
    raise ValueError(f"gfpo_metric {metric!r} is not one of {METRICS}")


def select(score: Array, k, *, valid: Array | None = None) -> Array:
    """Keep mask `[P, G]` bool: the `k` highest-scoring valid responses of each prompt.

    Args:
      score: [P, G] (from `scores`).
      k: an int, or [P] ints (adaptive difficulty); a prompt with fewer than k valid responses keeps
        all of them.
      valid: optional [P, G] bool; an invalid response is never kept and takes no one's place.

    Equal scores go to the lower index: rank[p,g] = #{valid j : s_j > s_g, or s_j = s_g and j < g}.
    """
    s = jnp.asarray(score, jnp.float32)
    if s.ndim != 2:
        raise ValueError(f"score must be [P, G], got shape {s.shape}")
    v = jnp.ones(s.shape, bool) if valid is None else jnp.asarray(valid, bool)
    idx = jnp.arange(s.shape[1])
    s_g, s_j = s[:, :, None], s[:, None, :]
    ahead = (s_j > s_g) | ((s_j == s_g) & (idx[None, None, :] < idx[None, :, None]))
    rank = jnp.sum(ahead & v[:, None, :], axis=-1)
    k = jnp.broadcast_to(jnp.asarray(k, jnp.int32), s.shape[:1])
    return v & (rank < k[:, None])


def keep_mask(rewards: Array, lengths: Array, k, *, metric: str, valid: Array | None = None) -> Array:
    """`select(scores(rewards, lengths, metric=metric), k, valid=valid)`: the GFPO keep mask [P, G] bool."""
    return select(scores(rewards, lengths, metric=metric), k, valid=valid)


def difficulty_keep(prompt_mean: Array, thresholds: Array, ks) -> Array:
    """Adaptive k `[P]` int32: `ks[bucket]`, bucket = how many of the ascending `thresholds` (q1, q2,
    q3) lie strictly below the prompt's mean reward (a mean equal to a quartile goes to the harder
    bucket), `ks` hardest bucket first."""
    ks = jnp.asarray(ks, jnp.int32)
    t = jnp.asarray(thresholds, jnp.float32)
    if t.shape != (ks.shape[0] - 1,):
        raise ValueError(f"{ks.shape[0]} k values need {ks.shape[0] - 1} thresholds, got shape {t.shape}")
    bucket = jnp.searchsorted(t, jnp.asarray(prompt_mean, jnp.float32), side="left")
    return ks[bucket]


def subset_advantages(rewards: Array, keep: Array, *, eps: float = 1e-6, unbiased: bool = True) -> Array:
    """GFPO's advantage `[P, G]`: `(r − mean_S r) / (std_S r + eps)` over the kept subset `S` of each
    prompt, exactly 0 on dropped responses and on subsets whose rewards are all equal."""
    return advantages.grpo(rewards, valid=keep, eps=eps, unbiased=unbiased)


def filter_mask(mask: Array, keep: Array) -> Array:
    """The response mask `[P, G, T]` with the dropped responses zeroed (out of loss and denominator)."""
    m = jnp.asarray(mask)
    return m * jnp.asarray(keep, m.dtype)[..., None]
