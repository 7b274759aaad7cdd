"""Process supervision (docs/objectives.md#process-supervision; DeepSeekMath §4.1.3): advantages from step rewards.

A process reward gives response `i` step rewards `r_i^(j)` that end at token indices `e_i^(j)`.
They are normalised over ALL step rewards of the group (every response's steps pooled),

    r̃ = (r − mean(R_group)) / (std(R_group) + eps),

and a token's advantage is the sum of the normalised rewards of the steps ending at or after it:

    Â_{i,t} = Σ_{j: e_i^(j) ≥ t} r̃_i^(j).

With a discount γ in (0, 1] (`discount`; 1 = the plain sum above, bit for bit), the normalised reward of
step k seen from a token of step j ≤ k (the first step ending at or after the token) weighs γ^(k − j):

    Â_{i,t} = Σ_{k: e_i^(k) ≥ t} γ^(k − j(t)) r̃_i^(k),   i.e.  Â_t = d_t + γ_t Â_{t+1},

with d_t the normalised rewards of the steps ending at t, and γ_t = γ where a real step ends at t (the
next token starts a later step), 1 elsewhere. Steps are counted by their ends: steps that end at the
same token count as one step, padding and masked steps (or negative ends) count for nothing, and
ends at or past T count as ending at T − 1.

Tokens after a response's last step end get 0. Inputs are fixed-shape and padded: `J` step slots
per response, `step_mask` 1 on the real ones. `std` is unbiased (n − 1) or biased as configured; a
group whose (real) step rewards are all equal, or that has fewer than two, gets exactly 0.

`grpo_process` is the registry's estimator (the shared signature of `advantages.py`). It takes
`StepRewards`, or a plain [P, G] outcome reward, read as ONE step ending at the response's last
token: that is DeepSeekMath's outcome supervision, `grpo` broadcast to the tokens.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from dapo_jax.objectives.advantages import group_mean_std


class StepRewards(NamedTuple):
    """Per-step rewards of a rollout batch, padded to `J` steps per response (a pytree: jit-able)."""

    rewards: jax.Array  # [P, G, J] float: r_i^(j)
    ends: jax.Array  # [P, G, J] int: e_i^(j), the index of the step's last token in the response
    mask: jax.Array  # [P, G, J]: 1 on real steps, 0 on padding slots


def _f32(x):
    return jnp.asarray(x, jnp.float32)


def process_advantages(step_rewards, step_ends, step_mask, mask, *, valid=None, eps=1e-6, unbiased=True,
                       discount=1.0):
    """Token advantages [P, G, T] from step rewards (the module docstring's formula), times `mask`.

    Args:
      step_rewards: [P, G, J] step rewards.
      step_ends: [P, G, J] int token index of each step's last token. An end at or past T counts for
        every token (it is >= every t < T); a negative end for none.
      step_mask: [P, G, J] 1 on real steps.
      mask: [P, G, T] response mask; the result is 0 where it is 0.
      valid: optional [P, G]: the steps of an invalid response leave the group statistics, and the
        response gets 0.
      eps, unbiased: `std + eps`, and the (n − 1) or n divisor.
      discount: γ in (0, 1], a Python float: step k weighs γ^(k − j) from a token of step j (the module
        docstring); 1.0 = the plain sum.
    """
    if not 0.0 < discount <= 1.0:
        raise ValueError(f"discount must be in (0, 1], got {discount}")
    r, sm = _f32(step_rewards), _f32(step_mask)
    if r.ndim != 3 or jnp.shape(step_ends) != r.shape or sm.shape != r.shape:
        raise ValueError(f"step_rewards, step_ends and step_mask must share one [P, G, J] shape, got "
                         f"{r.shape}, {jnp.shape(step_ends)}, {sm.shape}")
    m = _f32(mask)
    if m.shape[:2] != r.shape[:2]:
        raise ValueError(f"mask has shape {m.shape}, expected {r.shape[:2]} + (T,)")
    p, g, j = r.shape
    t = m.shape[-1]
    if valid is not None:
        sm = sm * _f32(valid)[..., None]
    mean, std, zero = group_mean_std(r.reshape(p, g * j), valid=sm.reshape(p, g * j), unbiased=unbiased)
    normed = (r - mean[..., None]) / (std[..., None] + eps)
    normed = jnp.where(zero[..., None] | (sm <= 0), 0.0, normed)
    ends = jnp.asarray(step_ends, jnp.int32)
    normed = jnp.where(ends >= 0, normed, 0.0)
    # Scatter r̃ to its end token (past-the-end ends land on T − 1, same sum), then sum from the right.
    rows = jnp.arange(p * g)[:, None]
    dense = jnp.zeros((p * g, t), jnp.float32).at[rows, jnp.clip(ends, 0, t - 1).reshape(p * g, j)].add(
        normed.reshape(p * g, j)).reshape(p, g, t)
    if discount == 1.0:
        return jnp.cumsum(dense[..., ::-1], axis=-1)[..., ::-1] * m
    # γ_t: γ at the tokens where a real step ends (it separates this step from the next), 1 elsewhere.
    real = ((sm > 0) & (ends >= 0)).astype(jnp.float32).reshape(p * g, j)
    boundary = jnp.zeros((p * g, t), jnp.float32).at[rows, jnp.clip(ends, 0, t - 1).reshape(p * g, j)].max(
        real).reshape(p, g, t) > 0
    gammas = jnp.where(boundary, jnp.float32(discount), jnp.float32(1.0))

    def back(carry, x):  # Â_t = d_t + γ_t Â_{t+1}, from the right
        d_t, g_t = x
        a_t = d_t + g_t * carry
        return a_t, a_t

    _, adv = jax.lax.scan(back, jnp.zeros((p, g), jnp.float32),
                          (jnp.moveaxis(dense, -1, 0), jnp.moveaxis(gammas, -1, 0)), reverse=True)
    return jnp.moveaxis(adv, 0, -1) * m


def outcome_as_steps(rewards, mask) -> StepRewards:
    """[P, G] outcome rewards as one step per response, ending at its last valid token."""
    r, m = _f32(rewards), _f32(mask)
    last = jnp.maximum(jnp.sum(m, axis=-1) - 1, 0).astype(jnp.int32)
    return StepRewards(r[..., None], last[..., None], jnp.ones(r.shape + (1,), jnp.float32))


def grpo_process(rewards, *, mask=None, valid=None, eps=1e-6, unbiased=True, kl_penalty=None, discount=1.0):
    """Process-supervised GRPO advantages [P, G, T] (`process_advantages`), for the registry.

    `rewards` is `StepRewards` (process supervision) or [P, G] outcome rewards (one step at the
    last token: `grpo` on every token). `mask` [P, G, T] is required; `kl_penalty` is not supported
    (use the KL in the loss). `discount` is γ over the steps (`process_advantages`).
    """
    if kl_penalty is not None:
        raise ValueError("grpo_process takes no KL in the reward: use kl_in='loss'")
    if mask is None:
        raise ValueError("grpo_process is token-level: pass mask [P, G, T]")
    steps = rewards if isinstance(rewards, StepRewards) else outcome_as_steps(rewards, mask)
    return process_advantages(*steps, mask, valid=valid, eps=eps, unbiased=unbiased, discount=discount)
