"""On-policy distillation (docs/stages.md#on-policy-distillation): the student samples, a frozen teacher
scores the student's tokens, and the per-token reverse KL is the (negative) advantage.

For a response `o` the student π_θ sampled, at every token

    k_t = log π_θ(o_t | q, o_<t) − log π_T(o_t | q, o_<t)      (the sampled-token estimate of KL(π_θ ‖ π_T))
    A_t = A^task_t · w − β · k_t

with `β = distill.coef`, `w = distill.task_weight` (0: distillation alone) and `A^task` the objective's
own advantage of the run's reward. `k_t` is computed with π_old (the sampler's policy) and held
constant, so the policy-gradient loss `−E[A_t · ∇ log π_θ(o_t)]` (at ratio 1) has the expectation

    E_{o_t ~ π}[(log π(o_t) − log π_T(o_t)) ∇ log π(o_t)] = ∇ KL(π(·|c) ‖ π_T(·|c))

per context `c` (the score-function identity; `Σ_v ∇π(v) = 0` removes the KL's own derivative term):
each step descends the reverse KL to the teacher on the contexts the student itself reaches, as verl's
and prime-rl's `opd` and Thinking Machines' on-policy distillation do. Reverse KL is mode-seeking: the
student is pushed off what the teacher finds unlikely rather than made to cover all of the teacher.
"""

from __future__ import annotations

import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag


def reverse_kl_tokens(logp, teacher_logp):
    """`[...]` the per-token estimate `log π(o_t) − log π_T(o_t)` of KL(π ‖ π_T) (not masked), float32."""
    return jnp.asarray(logp, jnp.float32) - jnp.asarray(teacher_logp, jnp.float32)


def distill_advantages(advantages, logp, teacher_logp, mask, *, coef: float, task_weight: float = 1.0):
    """`[P, G, T]` token advantages `w·A^task − β·(log π − log π_T)`, 0 outside `mask`.

    Args:
      advantages: `[P, G]` or `[P, G, T]` the objective's advantages of the task reward (broadcast over T).
      logp: `[P, G, T]` log π_old of the sampled tokens (the student's, constant).
      teacher_logp: `[P, G, T]` the teacher's log-probs of the same tokens.
      mask: `[P, G, T]` the response mask.
      coef: β > 0; task_weight: w >= 0.
    """
    m = jnp.asarray(mask, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    adv = jnp.broadcast_to(adv[..., None] if adv.ndim == 2 else adv, m.shape)
    kl = jnp.where(m > 0, reverse_kl_tokens(logp, teacher_logp), 0.0)  # padding's log-probs never leak
    return (task_weight * adv - coef * kl) * m


def reverse_kl_metric(logp, teacher_logp, mask):
    """`(Σ k_t·m, Σ m)`: the batch's token-mean reverse KL estimate, as a diagnostics pair."""
    return diag.masked_sum_count(reverse_kl_tokens(logp, teacher_logp), mask)
