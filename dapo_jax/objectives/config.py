"""`ObjectiveConfig`: every knob of a GRPO-family objective, frozen, validated, hashable.

The config is the only thing the trainer passes to the objective functions (as a static argument of
`jax.jit`), so it is frozen and hashable, and it is validated once, at construction: an invalid value
fails here, naming the field, never later inside a traced function.

Defaults are the DAPO paper's operating point where the paper fixes one (clip-higher 0.2 / 0.28,
token-mean loss, no KL, rewards +1 / -1); the named recipes in `configs/objectives/*.yaml` override
them (see `registry.load_objective`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AdvantageName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "batch_norm"]
PolicyLossName = Literal["clipped_surrogate", "gspo", "gspo_token", "cispo"]
AggregationName = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "constant_norm"]
KLEstimatorName = Literal["k1", "k2", "k3"]

# Losses whose ratio clip is PPO's trust region: there, eps_high < eps_low would be "clip-lower".
# CISPO clips a detached importance weight instead; its usual lower bound is 0 (eps_low = 1).
_TRUST_REGION_LOSSES = ("clipped_surrogate", "gspo", "gspo_token")


class ObjectiveConfig(BaseModel):
    """One GRPO-family objective, fully specified.

    Attributes (see /docs objectives.md for the math):
      name: a label for logs; nothing branches on it.
      advantage: the advantage estimator (`advantages.py`).
      std_eps, std_unbiased: the std normaliser `(r - mean) / (std + std_eps)`; unbiased = N-1 (verl, TRL).
      policy_loss: the per-token loss (`policy_loss.py`).
      eps_low, eps_high: ratio clip `[1 - eps_low, 1 + eps_high]` (clip-higher when eps_high > eps_low).
      dual_clip_c: dual-clip constant `c > 1` bounding negative-advantage tokens; None = off.
      loss_agg: how per-token losses become (loss_sum, denominator) (`aggregation.py`).
      max_response_length: `T_max` for `constant_norm` and `L_max` for the overlong penalty (tokens).
        May be None in the file; the trainer fills it from its sampling config.
      kl_estimator, kl_beta, kl_in, kl_clamp: KL to the reference policy; beta = 0 means no reference
        model at all. kl_in = "loss" adds `beta * kl_t` per token, "reward" adds `-beta * kl_t` to
        the token rewards before the advantage. kl_clamp clamps the estimator's value (None = off).
      entropy_coef: entropy bonus `alpha_H` (loss -= alpha_H * H_t); 0 = off (no entropy needed).
      high_entropy_quantile: q in (0, 1]: train only on tokens whose entropy is at or above the
        batch's (1 - q) quantile; None = off.
      overlong_filtering: truncated responses get mask 0.
      overlong_buffer: `L_cache`, the soft overlong punishment band in tokens; None = off.
      overlong_penalty_factor: scale of the soft overlong punishment.
      dynamic_sampling, dynamic_sampling_metric: DAPO's group filter `0 < #correct < G` ("correct")
        or non-zero reward spread ("reward").
      reward_correct, reward_wrong: the rule reward's two values.
      multi_reward, reward_weights: how [P, G, K] rewards combine; weights None = all ones.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    # advantages
    advantage: AdvantageName = "grpo"
    std_eps: float = Field(1e-6, ge=0.0)
    std_unbiased: bool = True
    # policy loss
    policy_loss: PolicyLossName = "clipped_surrogate"
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip_c: float | None = None
    loss_agg: AggregationName = "token_mean"
    max_response_length: int | None = Field(None, gt=0)
    # KL to the reference policy
    kl_estimator: KLEstimatorName = "k3"
    kl_beta: float = 0.0
    kl_in: Literal["loss", "reward"] = "loss"
    kl_clamp: float | None = Field(10.0, gt=0.0)
    # entropy
    entropy_coef: float = 0.0
    high_entropy_quantile: float | None = Field(None, gt=0.0, le=1.0)
    # reward shaping
    overlong_filtering: bool = False
    overlong_buffer: int | None = Field(None, gt=0)
    overlong_penalty_factor: float = Field(1.0, ge=0.0)
    # dynamic sampling
    dynamic_sampling: bool = False
    dynamic_sampling_metric: Literal["correct", "reward"] = "correct"
    # rewards
    reward_correct: float = 1.0
    reward_wrong: float = -1.0
    multi_reward: Literal["sum", "normalize_then_sum"] = "sum"
    reward_weights: tuple[float, ...] | None = None

    @model_validator(mode="after")
    def _check(self) -> ObjectiveConfig:
        if not self.eps_low > 0:
            raise ValueError(f"eps_low must be > 0, got {self.eps_low}")
        if not self.eps_high > 0:
            raise ValueError(f"eps_high must be > 0, got {self.eps_high}")
        if self.policy_loss in _TRUST_REGION_LOSSES and self.eps_high < self.eps_low:
            raise ValueError(
                f"eps_high ({self.eps_high}) must be >= eps_low ({self.eps_low}) for policy_loss={self.policy_loss!r}"
            )
        if self.dual_clip_c is not None and not self.dual_clip_c > 1:
            raise ValueError(f"dual_clip_c must be > 1 (or None = off), got {self.dual_clip_c}")
        if not self.kl_beta >= 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.overlong_buffer is not None and self.max_response_length is not None:
            if self.overlong_buffer > self.max_response_length:
                raise ValueError(
                    f"overlong_buffer ({self.overlong_buffer}) must be <= max_response_length "
                    f"({self.max_response_length})"
                )
        if self.reward_weights is not None and len(self.reward_weights) == 0:
            raise ValueError("reward_weights must be None or non-empty")
        if self.multi_reward == "normalize_then_sum" and self.advantage == "reinforce_pp":
            raise ValueError(
                "multi_reward='normalize_then_sum' defines a sequence advantage; it cannot be used with "
                "advantage='reinforce_pp' (token-level returns): use multi_reward='sum'"
            )
        return self

    @property
    def needs_reference(self) -> bool:
        """True when reference log-probs must be computed (beta > 0); DAPO-style configs need none."""
        return self.kl_beta > 0

    @property
    def needs_entropy(self) -> bool:
        """True when the loss needs per-token entropies."""
        return self.entropy_coef != 0 or self.high_entropy_quantile is not None
