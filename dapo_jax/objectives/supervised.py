"""Supervised fine-tuning as an objective of the shared update (docs/stages.md#sft).

The negative log-likelihood of the assistant's tokens, token-mean over the whole optimizer batch:

    L_SFT = -Σ_{i,t} m_{i,t} · log π_θ(o_{i,t} | q_i, o_{i,<t}) / Σ_{i,t} m_{i,t}

`m` is 1 on the tokens the assistant wrote (the response, its end-of-turn token included) and 0 on
the prompt, on other roles' turns and on padding. As every objective of the registry it returns the
additive pair `(loss_sum, denominator)`: the denominator (a token count) depends on the mask only,
so the update's `Σ_micro loss_sum / Σ_micro den` is the batch's token mean exactly, however the batch
is split into mini-batches, micro-batches, packed chunks or devices (training/update/train_step.py).

`sft_terms` is `registry.OBJECTIVE_KINDS["sft"]`: `loss.objective_terms` calls it in place of the
policy-gradient loss when `ObjectiveConfig.kind == "sft"`. The advantages, `old_logp`, `ref_logp`
and the entropies the update passes are not used (the step still computes them, as zeros).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dapo_jax.objectives import diagnostics as diag


def sft_terms(cfg, *, logp, mask, **unused):
    """`(Σ -logp·m, Σ m, metrics)` of one (micro-)batch.

    Args:
      cfg: the objective (static; kind="sft" has no option of its own).
      logp: `[P, G, T]` log π_θ of the data's response tokens (the differentiated input).
      mask: `[P, G, T]` 1 on the assistant tokens to train, 0 elsewhere.
      unused: `objective_terms`' other arguments (advantages, old_logp, ...): ignored.

    Metrics: `nll`, the token mean of -log π over the masked tokens (exp(nll) is the perplexity).
    """
    del cfg, unused
    m = jnp.asarray(mask, jnp.float32)
    if m.ndim != 3:
        raise ValueError(f"mask must be [P, G, T], got shape {m.shape}")
    lp = jnp.asarray(logp, jnp.float32)
    if lp.shape != m.shape:
        raise ValueError(f"logp has shape {lp.shape}, expected the mask's {m.shape}")
    nll = jnp.where(m > 0, -lp * m, 0.0)  # a padding position's value never leaks, even a NaN
    return jnp.sum(nll), jnp.sum(m), {"nll": diag.masked_sum_count(jax.lax.stop_gradient(-lp), m)}
