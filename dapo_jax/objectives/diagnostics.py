"""Diagnostics of one loss evaluation, in a form that adds up over micro-batches and devices.

Every metric is a pair `(value, count)` of float32 scalars:
  - names ending in `_min` / `_max`: value is the min / max over the counted tokens (±inf when the
    count is 0); pairs combine with min / max of the values and the sum of the counts;
  - every other name: value is a SUM over the counted items; pairs combine by adding both.
`combine_metrics` adds a list of such dicts; `finalize_metrics` turns one into scalars
(sum / count, or min / max; 0.0 where the count is 0, never NaN).
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def masked_sum_count(x, mask):
    """(Σ x·m, Σ m) over the positions where mask > 0 (x outside the mask never leaks, even NaN)."""
    m = jnp.asarray(mask, jnp.float32)
    return jnp.sum(jnp.where(m > 0, jnp.asarray(x, jnp.float32) * m, 0.0)), jnp.sum(m)


def masked_min_count(x, mask):
    m = jnp.asarray(mask, jnp.float32)
    return jnp.min(jnp.where(m > 0, jnp.asarray(x, jnp.float32), jnp.inf)), jnp.sum(m)


def masked_max_count(x, mask):
    m = jnp.asarray(mask, jnp.float32)
    return jnp.max(jnp.where(m > 0, jnp.asarray(x, jnp.float32), -jnp.inf)), jnp.sum(m)


def zero_advantage_groups(advantages, mask):
    """(#groups whose valid tokens all have A == 0 exactly, #groups with any valid token).

    advantages, mask [P, G, T]: with GRPO-style estimators these are the zero-spread groups."""
    m = jnp.asarray(mask, jnp.float32)
    a = jnp.asarray(advantages, jnp.float32)
    has_tokens = jnp.sum(m, axis=(1, 2)) > 0
    nonzero = jnp.sum(jnp.where(m > 0, a != 0, False), axis=(1, 2)) > 0
    zero = has_tokens & ~nonzero
    return jnp.sum(zero.astype(jnp.float32)), jnp.sum(has_tokens.astype(jnp.float32))


# DAPO's Figure 3 in miniature: where the clip binds. π_old = exp(old_logp) in ten bins of 0.1 (the
# last one includes 1), and the ratio in the bins these edges make (below 0.8, [0.8, 0.9), ...,
# [1.2, 1.28), 1.28 and above): [1.2, 1.28) with A > 0 is exactly what the symmetric 0.2 clip stops and
# clip-higher's 0.28 lets through.
P_OLD_BINS = 10
RATIO_EDGES = (0.8, 0.9, 1.0, 1.1, 1.2, 1.28)


def clip_histograms(old_logp, ratio, advantages, mask, *, eps_low: float, eps_high: float) -> dict:
    """Histograms of the clipped tokens' π_old and of the ratio, as additive pairs (a vector of bins each).

    old_logp, ratio, advantages, mask: [P, G, T] (ratio: the one the policy loss clips; advantages
    broadcast to tokens). Every pair is (tokens in the bin, valid tokens), so a finalised value is a
    fraction of the update's tokens and the bins of a name add up to its whole:
      clip_high_p_old_K (K = 0..9): A > 0 and ρ > 1 + ε_high (the upper clip binds; their sum is
        `clip_frac_high`) with π_old in [K/10, (K+1)/10);
      clip_low_p_old_K: A < 0 and ρ < 1 − ε_low (sum: `clip_frac_low`);
      ratio_pos_K / ratio_neg_K (K = 0..6): A > 0 / A < 0 with ρ in bin K of RATIO_EDGES;
      clip_high_possible: A > 0 and π_old < 1 / (1 + ε_high), the only tokens the upper clip can ever
        stop (ρ > 1 + ε_high needs π_θ > π_old·(1 + ε_high), and π_θ <= 1).
    Each histogram is one pair `([bins], valid tokens)`, counted by one contraction with the bins' one-hot
    (`finalize_metrics` names its bins `NAME_K`): 34 scalar reductions, each its own fusion, made every
    update program about a second slower to compile on a CPU.
    WHY: DAPO argues that the upper clip binds on low-probability tokens (exploration) and the lower one
    on likely ones; whether that happens, and how much ratio mass sits in [1 + 0.2, 1 + 0.28), says
    whether clip-higher can change anything in a given regime.
    """
    m = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    r = jnp.asarray(ratio, jnp.float32)
    p_bin = jnp.clip(jnp.floor(jnp.exp(jnp.asarray(old_logp, jnp.float32)) * P_OLD_BINS), 0, P_OLD_BINS - 1)
    r_bin = jnp.searchsorted(jnp.asarray(RATIO_EDGES, jnp.float32), r, side="right")
    high = (adv > 0) & (r > 1.0 + eps_high)
    low = (adv < 0) & (r < 1.0 - eps_low)
    p_old = jnp.exp(jnp.asarray(old_logp, jnp.float32))
    p_hot = jax.nn.one_hot(jnp.where(jnp.isnan(p_bin), -1, p_bin).astype(jnp.int32), P_OLD_BINS, dtype=jnp.float32)
    r_hot = jax.nn.one_hot(r_bin, len(RATIO_EDGES) + 1, dtype=jnp.float32)
    total = jnp.sum(m)

    def hist(select, hot):
        return jnp.einsum("...k,...->k", hot, jnp.where(select, m, 0.0)), total

    out = {"clip_high_possible": masked_sum_count((adv > 0) & (p_old * (1.0 + eps_high) < 1.0), m),
           "clip_high_p_old": hist(high, p_hot), "clip_low_p_old": hist(low, p_hot),
           "ratio_pos": hist(adv > 0, r_hot), "ratio_neg": hist(adv < 0, r_hot)}
    return out


def clip_grad_shares(ratio, advantages, mask, grad_norms, *, eps_low: float, eps_high: float) -> dict:
    """The clipped tokens' share of the surrogate's output-layer gradient, as additive pairs.

    ratio, advantages, mask, grad_norms: [P, G, T]; grad_norms = `‖∂ log π(y_t)/∂W‖` of the output layer
    (`models/logprobs.output_grad_norms`). Unclipped, token t adds `A_t ρ_t ∇ log π(y_t)` to the surrogate's
    gradient, of output-layer norm `a_t = |A_t| ρ_t g_t`; where the clip binds it adds nothing. Pairs
    `(Σ_clipped a_t, Σ_all a_t)` over the loss mask, so a finalised value is the share of the per-token norms
    Σ a_t that the clip removes, whatever the batch is split into:
      clip_grad_share_high: A > 0 and ρ > 1 + ε_high (the tokens of `clip_frac_high`);
      clip_grad_share_low: A < 0 and ρ < 1 − ε_low (those of `clip_frac_low`).
    WHY: a token's gradient is not its count. ‖e_y − p‖ ≥ 1 − p_y, so an unlikely token moves the output
    layer more than a likely one; the token share of the clip (`clip_frac_*`) can be small while its share of
    the gradient is not. This is a sum of norms (each token's own), not the norm of the clipped sum.
    """
    m = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    r = jnp.asarray(ratio, jnp.float32)
    a = jnp.abs(adv) * r * jnp.asarray(grad_norms, jnp.float32) * m
    total = jnp.sum(a)
    return {"clip_grad_share_high": (jnp.sum(jnp.where((adv > 0) & (r > 1.0 + eps_high), a, 0.0)), total),
            "clip_grad_share_low": (jnp.sum(jnp.where((adv < 0) & (r < 1.0 - eps_low), a, 0.0)), total)}


def _kind(name: str) -> str:
    return "min" if name.endswith("_min") else "max" if name.endswith("_max") else "sum"


def combine_metrics(metrics: Sequence[dict]) -> dict:
    """Combine the metric dicts of several micro-batches / devices into one of the same form."""
    out: dict = {}
    for md in metrics:
        for name, (value, count) in md.items():
            if name not in out:
                out[name] = (value, count)
                continue
            v0, c0 = out[name]
            kind = _kind(name)
            v = v0 + value if kind == "sum" else jnp.minimum(v0, value) if kind == "min" else jnp.maximum(v0, value)
            out[name] = (v, c0 + count)
    return out


def combine_stacked(metrics: dict) -> dict:
    """`combine_metrics` for pairs stacked along leading axes (the output of a `lax.scan` over micro-batches):
    the count's axes are the stacked ones, a value's further axes its own (a histogram's bins)."""
    reduce = {"sum": jnp.sum, "min": jnp.min, "max": jnp.max}
    return {name: (reduce[_kind(name)](value, axis=tuple(range(jnp.ndim(count)))), jnp.sum(count))
            for name, (value, count) in metrics.items()}


def finalize_metrics(metrics: dict) -> dict:
    """`{name: (value, count)}` -> `{name: float32 scalar}` (jit-able; `float()` them on the host):
    sum / count, or the min / max, and 0.0 where the count is 0; a vector value (a histogram) becomes one
    scalar per bin, `NAME_K`. Adds `advantage_std` from the moments."""
    out = {}
    for name, (value, count) in metrics.items():
        value, count = jnp.asarray(value, jnp.float32), jnp.asarray(count, jnp.float32)
        v = value / jnp.maximum(count, 1e-12) if _kind(name) == "sum" else value
        v = jnp.where(count > 0, v, 0.0)
        if v.ndim == 1:
            out.update({f"{name}_{k}": v[k] for k in range(v.shape[0])})
        else:
            out[name] = v
    if "advantage_mean" in out and "advantage_sq_mean" in out:
        out["advantage_std"] = jnp.sqrt(jnp.maximum(out["advantage_sq_mean"] - jnp.square(out["advantage_mean"]), 0.0))
    return out
