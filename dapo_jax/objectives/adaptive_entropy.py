"""Skywork-OR1's adaptive entropy coefficient (He et al., "Skywork Open Reasoner 1 Technical Report",
arXiv 2505.22312; docs/objectives_recent.md#adaptive-entropy-skywork-or1).

The loss of step k is `L = L_PG − α_k · H̄` (`policy_loss.entropy_bonus` with a coefficient that changes
from step to step). A controller keeps the policy's entropy near a target `tgt`: after step k, with `e_k`
the step's token-mean entropy,

    c_{k+1} = clip(c_k + Δ, c_min, c_max)   if e_k < tgt
              clip(c_k − Δ, c_min, c_max)   otherwise (equality decrements, as the authors' code)
    g_{k+1} = 1[e_k < tgt]                  the bonus is on only while the entropy is below target
    α_{k+1} = c_{k+1} · g_{k+1}             the coefficient step k+1's loss applies

This is the authors' code (`EntController`: one step of lag, the gate from the previous step's entropy);
the paper as quoted gates with the current step's entropy, TRL increments on equality
(docs/objectives_recent.md lists the differences). Step 1 applies `α_1 = c_0` (`EntropyControl.start`).
The controller's state `(c, g)` is the run's (`training/state/run_state.py` checkpoints it), the update
below is pure.
"""

from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import jax.numpy as jnp


class EntropyControl(NamedTuple):
    """The controller's state between steps: the coefficient `c` and the gate `g` (floats / bools,
    or float32 / bool scalars under jit)."""

    coef: float  # c_k
    gate: bool  # g_k = 1[e_{k-1} < tgt]

    @property
    def alpha(self):
        """α_k = c_k · g_k, the coefficient the step's loss applies."""
        return self.coef * self.gate

    @classmethod
    def start(cls, coef_init: float) -> "EntropyControl":
        """Before step 1: `c_0` with the gate open (step 1 applies c_0)."""
        return cls(float(coef_init), True)


def adaptive_entropy_update(control: EntropyControl, entropy, *, target: float, delta: float, coef_max: float,
                            coef_min: float = 0.0) -> EntropyControl:
    """The next step's `EntropyControl` from this step's token-mean entropy `e_k` (a scalar).

    float32 arithmetic (as the step's metrics), so the trajectory does not depend on where it runs and a
    checkpoint's floats restore it exactly. A non-finite entropy counts as "not below target" (decrement,
    gate closed)."""
    c = jnp.asarray(control.coef, jnp.float32)
    below = jnp.asarray(entropy, jnp.float32) < jnp.float32(target)
    step = jnp.where(below, jnp.float32(delta), -jnp.float32(delta))
    c = jnp.clip(c + step, jnp.float32(coef_min), jnp.float32(coef_max))
    return EntropyControl(c, below)


def entropy_controller(cfg) -> Callable | None:
    """`adaptive_entropy_update` with an `ObjectiveConfig`'s options (entropy_target, entropy_coef_delta,
    entropy_coef_max), or None when the coefficient does not adapt."""
    if cfg.entropy_target is None:
        return None
    return functools.partial(adaptive_entropy_update, target=cfg.entropy_target, delta=cfg.entropy_coef_delta,
                             coef_max=cfg.entropy_coef_max)


__all__ = ["EntropyControl", "adaptive_entropy_update", "entropy_controller"]
