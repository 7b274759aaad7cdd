"""`ObjectiveConfig`: every knob of a GRPO-family objective, frozen, validated, hashable.

The config is the only thing the trainer passes to the objective functions (as a static argument of
`jax.jit`), so it is frozen and hashable, and it is validated once, at construction: an invalid value
fails here, naming the field, never later inside a traced function.

Defaults are the DAPO paper's operating point where the paper fixes one (clip-higher 0.2 / 0.28,
token-mean loss, no KL, rewards +1 / -1); the named recipes in `dapo_jax/configs/objectives/*.yaml` override
them (see `registry.load_objective`).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

AdvantageName = Literal["grpo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "batch_norm", "gae",
                        "gdpo_pair", "grpo_process"]
PolicyLossName = Literal["clipped_surrogate", "gspo", "gspo_token", "cispo", "sapo", "gmpo", "clip_cov", "kl_cov",
                         "dppo_tv", "dppo_kl"]
AggregationName = Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "group_mean_token_mean",
                          "constant_norm"]
KLEstimatorName = Literal["k1", "k2", "k3"]
OffPolicyName = Literal["token_tis", "seq_tis", "token_mask", "seq_mask", "geo_seq_mask", "icepop", "k3_seq_mask"]
# corrections that drop tokens or responses from the mask (and the denominator), and those that weight ℓ
_MASKING_CORRECTIONS = ("token_mask", "seq_mask", "geo_seq_mask", "k3_seq_mask")
_WEIGHTING_CORRECTIONS = ("token_tis", "seq_tis", "icepop")

# Losses whose ratio clip is PPO's trust region: there, eps_high < eps_low would be "clip-lower".
# CISPO clips a detached importance weight instead; its usual lower bound is 0 (eps_low = 1).
# GSPO's sequence-level clip ranges are tiny (3e-4 / 4e-4): there eps_high < eps_low is taken for swapped values. A
# token-level clip may lean either way: scripts/clip_grid.py runs eps_low 0.3 against eps_high 0.2 (issue 46's grid).
_TRUST_REGION_LOSSES = ("gspo", "gspo_token")


class ObjectiveConfig(BaseModel):
    """One GRPO-family objective, fully specified.

    Attributes (the math: docs/objectives.md):
      name: the recipe of `dapo_jax/configs/objectives/` (or a YAML file) the other keys start from; in a run
        config every other objective key overrides that recipe's value. Nothing in the math branches on it.
      kind: "policy_gradient" (a per-token policy loss, the fields below), "gdpo" (group DPO,
        docs/objectives.md#gfpo-gdpo, `gdpo.py`: needs advantage="gdpo_pair" and the reference policy)
        or "sft" (supervised fine-tuning on the data's responses, `supervised.py`, docs/stages.md).
      gdpo_beta: GDPO's β, the scale of the log-ratio margin inside the sigmoid.
      advantage: the advantage estimator (`advantages.py`).
      std_eps, std_unbiased: the std normaliser `(r - mean) / (std + std_eps)`; unbiased = N-1 (verl, TRL).
      policy_loss: the per-token loss (`policy_loss.py`).
      eps_low, eps_high: ratio clip `[1 - eps_low, 1 + eps_high]` (clip-higher when eps_high > eps_low).
      dual_clip_c: dual-clip constant `c > 1` bounding negative-advantage tokens; None = off.
      clip_grad_share: a diagnostic: log the clipped tokens' share of the output layer's per-token gradient
        norms (`clip_grad_share_high` / `_low`, `diagnostics.clip_grad_shares`); costs one more output-layer
        pass per update. The loss is unchanged.
      loss_agg: how per-token losses become (loss_sum, denominator) (`aggregation.py`).
      max_response_length: `T_max` for `constant_norm` and `L_max` for the overlong penalty (tokens).
        May be None in the file; the trainer fills it from its sampling config.
      kl_estimator, kl_beta, kl_in, kl_clamp: KL to the reference policy; beta = 0 means no reference
        model at all. kl_in = "loss" adds `beta * kl_t` per token, "reward" adds `-beta * kl_t` to
        the token rewards before the advantage. kl_clamp clamps the estimator's value (None = off).
      entropy_coef: entropy bonus `alpha_H` (loss -= alpha_H * H_t); 0 = off (no entropy needed).
      entropy_target, entropy_coef_delta, entropy_coef_max, entropy_coef_init: Skywork-OR1's adaptive entropy
        coefficient (`adaptive_entropy.py`): α_k = c_k · 1[e_{k-1} < tgt], c moved by ±Δ after each step towards
        keeping the token-mean entropy at entropy_target, clipped to [0, entropy_coef_max], c_0 =
        entropy_coef_init. entropy_target None = off (entropy_coef is then the fixed coefficient).
      entropy_driven_advantage: EDGE-GRPO's EDA (`entropy_advantage.py`, docs/grpo_variants.md):
        A_i · N / P̄_i with P̄_i the response's mean token entropy and N its mean over the whole update batch.
      high_entropy_quantile: q in (0, 1]: train only on tokens whose entropy is at or above the
        batch's (1 - q) quantile; None = off.
      overlong_filtering: truncated responses get mask 0.
      overlong_buffer: `L_cache`, the soft overlong punishment band in tokens; None = off.
      overlong_penalty_factor: scale of the soft overlong punishment.
      dynamic_sampling, dynamic_sampling_metric: DAPO's group filter `0 < #correct < G` ("correct")
        or non-zero reward spread ("reward").
      gfpo_keep, gfpo_metric, gfpo_adaptive, gfpo_window: GFPO group filtering (`gfpo.py`): train on
        the gfpo_keep = k best of the rollout's G responses per prompt by `gfpo_metric` ("length":
        shortest; "token_efficiency": highest reward / length), advantages inside the kept subset.
        gfpo_adaptive = (k_hardest, k_2, k_3, k_easiest): k per quartile of the prompt's mean reward
        among the last gfpo_window prompts (overrides gfpo_keep). Both None = off.
      reward_correct, reward_wrong: the rule reward's two values.
      multi_reward, reward_weights: how [P, G, K] rewards combine; weights None = all ones.
      off_policy_correction: correct for a behaviour policy μ != π_old (`off_policy.py`): "token_tis" /
        "seq_tis" weight ℓ by sg(min(π_old/μ, C)) per token / per response, "token_mask" / "seq_mask"
        drop the tokens / responses whose ratio is outside [1/C, C]; None = off. Needs the sampler's
        log-probs (`behaviour_logp`) and a recomputed π_old.
      off_policy_cap: C > 1 (default 2).
      off_policy_cap_low: a lower bound C_low in (0, C) in place of 1/C (masks), or a lower truncation
        (TIS: clip(·, C_low, C)); None = 1/C for masks, none for TIS. "geo_seq_mask" keeps a response
        whose geometric-mean ratio is in [C_low, C], "icepop" weights a token by its ratio inside
        [C_low, C] and 0 outside, "k3_seq_mask" drops a response whose mean K3 exceeds
        off_policy_k3_threshold (`rollout_mismatch.py`).
      off_policy_k3_threshold: "k3_seq_mask"'s bound on a response's mean k − 1 − log k, k = π_old/μ.
      off_policy_batch_normalize: divide the correction's weights by their mean over the update batch.
      off_policy_bypass: no recomputed π_old: π_old is the sampler's (rollout.recompute_old_logp=false) and
        the masks compare the current policy (detached) with μ, re-taken every micro-step (verl's bypass
        mode). Masking corrections only: a weight on top of a ratio to μ would count it twice.
      sapo_tau_pos, sapo_tau_neg: SAPO's gate temperatures for A > 0 / A <= 0 (`sapo.py`).
      clip_cov_ratio, clip_cov_lb, clip_cov_ub: Clip-Cov's fraction r and covariance window (ω_low, ω_high)
        (`covariance.py`).
      kl_cov_ratio, kl_cov_coef: KL-Cov's fraction k of the tokens and the β of its |logp − old| penalty.
      dppo_delta_low, dppo_delta_high, dppo_is_cap: DPPO's region δ for A <= 0 / A > 0 and the cap C on
        its importance weight (None = none) (`dppo.py`).
      opsm_delta: DeepSeek-V3.2's off-policy sequence mask δ (drop a negative-advantage response whose
        mean log(μ/π_θ) exceeds δ); None = off (`deepseek_v32.py`).
      kl_unbiased: DeepSeek-V3.2's unbiased KL: the estimator times π_θ/π_old (needs kl_beta > 0 in the loss).
      process_discount: γ in (0, 1] over process supervision's steps (advantage="grpo_process",
        `process.py`): step k weighs γ^(k − j) in the advantage of a token of step j; 1 = the plain sum.
        An agent run sets it from `agent.discount` (docs/agents.md).
      gamma, gae_lambda, critic_lambda, lambda_alpha, whiten_advantages, value_clip,
        value_pretrain_steps, nll_coef: the critic family (advantage="gae": PPO, VAPO; docs/objectives.md#critic-ppo-vapo,
        `gae.py`, `nll.py`): discount γ, the policy's GAE λ, the value targets' λ (decoupled GAE),
        VAPO's length-adaptive λ_policy = 1 - 1/(α·L) when lambda_alpha = α is set, whitening of the
        policy advantages over the batch, the value-loss clip ε_v (None = off), value pre-training
        steps N_pre before any policy update, and μ of the positive-example NLL term (0 = off).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = "custom"
    kind: Literal["policy_gradient", "gdpo", "sft"] = "policy_gradient"
    gdpo_beta: float = Field(0.1, gt=0.0)
    # advantages
    advantage: AdvantageName = "grpo"
    std_eps: float = Field(1e-6, ge=0.0)
    std_unbiased: bool = True
    process_discount: float = Field(1.0, gt=0.0, le=1.0)
    # policy loss
    policy_loss: PolicyLossName = "clipped_surrogate"
    eps_low: float = 0.2
    eps_high: float = 0.28
    dual_clip_c: float | None = None
    clip_grad_share: bool = False
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
    entropy_driven_advantage: bool = False
    entropy_target: float | None = Field(None, gt=0.0)
    entropy_coef_delta: float = Field(1e-4, gt=0.0)
    entropy_coef_max: float = Field(0.005, ge=0.0)
    entropy_coef_init: float = Field(0.0, ge=0.0)
    # reward shaping
    overlong_filtering: bool = False
    overlong_buffer: int | None = Field(None, gt=0)
    overlong_penalty_factor: float = Field(1.0, ge=0.0)
    # dynamic sampling
    dynamic_sampling: bool = False
    dynamic_sampling_metric: Literal["correct", "reward"] = "correct"
    # GFPO group filtering (docs/objectives.md#gfpo-gdpo)
    gfpo_keep: int | None = Field(None, ge=2)
    gfpo_metric: Literal["length", "token_efficiency"] = "length"
    gfpo_adaptive: tuple[int, int, int, int] | None = None
    gfpo_window: int = Field(1024, gt=0)
    # rewards
    reward_correct: float = 1.0
    reward_wrong: float = -1.0
    multi_reward: Literal["sum", "normalize_then_sum"] = "sum"
    reward_weights: tuple[float, ...] | None = None
    # off-policy correction (docs/objectives.md#off-policy-correction)
    off_policy_correction: OffPolicyName | None = None
    off_policy_cap: float = 2.0
    off_policy_cap_low: float | None = Field(None, gt=0.0)
    off_policy_k3_threshold: float = Field(0.01, gt=0.0)
    off_policy_batch_normalize: bool = False
    off_policy_bypass: bool = False
    # the objectives added since mid-2025 (docs/objectives_recent.md#since-mid-2025)
    sapo_tau_pos: float = Field(1.0, gt=0.0)
    sapo_tau_neg: float = Field(1.05, gt=0.0)
    clip_cov_ratio: float = Field(2e-4, gt=0.0, le=1.0)
    clip_cov_lb: float = 1.0
    clip_cov_ub: float = 5.0
    kl_cov_ratio: float = Field(2e-3, gt=0.0, le=1.0)
    kl_cov_coef: float = Field(1.0, ge=0.0)
    dppo_delta_low: float = Field(0.15, gt=0.0)
    dppo_delta_high: float = Field(0.15, gt=0.0)
    dppo_is_cap: float | None = Field(None, gt=0.0)
    opsm_delta: float | None = Field(None, ge=0.0)
    kl_unbiased: bool = False
    # critic (advantage="gae": PPO with GAE, VAPO; docs/objectives.md#critic-ppo-vapo)
    gamma: float = Field(1.0, ge=0.0, le=1.0)
    gae_lambda: float = Field(0.95, ge=0.0, le=1.0)
    critic_lambda: float = Field(0.95, ge=0.0, le=1.0)
    lambda_alpha: float | None = Field(None, gt=0.0)
    whiten_advantages: bool = True
    value_clip: float | None = Field(0.5, gt=0.0)
    value_pretrain_steps: int = Field(0, ge=0)
    nll_coef: float = Field(0.0, ge=0.0)

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
        if self.clip_grad_share and self.kind != "policy_gradient":
            raise ValueError(f"clip_grad_share is a per-token policy loss's diagnostic: kind={self.kind!r} has no clip")
        if self.gfpo_adaptive is not None and min(self.gfpo_adaptive) < 2:
            raise ValueError(f"gfpo_adaptive: every k must be >= 2 (a subset of 1 has no spread), got {self.gfpo_adaptive}")
        if not self.kl_beta >= 0:
            raise ValueError(f"kl_beta must be >= 0, got {self.kl_beta}")
        if self.overlong_buffer is not None and self.max_response_length is not None:
            if self.overlong_buffer > self.max_response_length:
                raise ValueError(
                    f"overlong_buffer ({self.overlong_buffer}) must be <= max_response_length "
                    f"({self.max_response_length})"
                )
        if not self.off_policy_cap > 1:
            raise ValueError(f"off_policy_cap must be > 1 (the ratio range is [1/C, C]), got {self.off_policy_cap}")
        if self.value_pretrain_steps and not self.uses_critic:
            raise ValueError(f"value_pretrain_steps={self.value_pretrain_steps} needs a critic: advantage='gae'")
        if self.uses_critic and self.sums_normalised_rewards:
            raise ValueError("advantage='gae' takes one reward per response: use multi_reward='sum'")
        if self.nll_coef > 0 and (self.uses_high_entropy_tokens
                                  or self.off_policy_correction in _MASKING_CORRECTIONS):
            raise ValueError("nll_coef > 0 scales the NLL term by the policy loss's denominator, known before "
                             "the update only when it depends on the mask alone: turn off high_entropy_quantile "
                             "and masking off-policy corrections, or set nll_coef = 0")
        self._check_since_2025()
        self._check_adaptive_entropy()
        if self.reward_weights is not None and len(self.reward_weights) == 0:
            raise ValueError("reward_weights must be None or non-empty")
        if self.sums_normalised_rewards and self.advantage == "reinforce_pp":
            raise ValueError(
                "multi_reward='normalize_then_sum' defines a sequence advantage; it cannot be used with "
                "advantage='reinforce_pp' (token-level returns): use multi_reward='sum'"
            )
        return self

    def _check_since_2025(self) -> None:
        if self.off_policy_cap_low is not None and not self.off_policy_cap_low < self.off_policy_cap:
            raise ValueError(f"off_policy_cap_low ({self.off_policy_cap_low}) must be < off_policy_cap "
                             f"({self.off_policy_cap})")
        if self.off_policy_batch_normalize and self.off_policy_correction not in _WEIGHTING_CORRECTIONS:
            raise ValueError(f"off_policy_batch_normalize normalises importance weights: it needs a weighting "
                             f"off_policy_correction {_WEIGHTING_CORRECTIONS}, got {self.off_policy_correction!r}")
        if self.off_policy_bypass and self.off_policy_correction not in _MASKING_CORRECTIONS:
            raise ValueError(f"off_policy_bypass re-takes a mask against the sampler each micro-step: it needs a "
                             f"masking off_policy_correction {_MASKING_CORRECTIONS}, got "
                             f"{self.off_policy_correction!r} (a weight would count the ratio to mu twice)")
        if not self.clip_cov_lb < self.clip_cov_ub:
            raise ValueError(f"clip_cov_lb ({self.clip_cov_lb}) must be < clip_cov_ub ({self.clip_cov_ub})")
        if self.policy_loss in ("clip_cov", "kl_cov") and self.entropy_driven_advantage:
            raise ValueError(f"policy_loss={self.policy_loss!r} selects tokens by the covariance of the advantages "
                             f"taken before the update; entropy_driven_advantage rescales them inside it: turn one off")
        if self.kl_unbiased and not (self.kl_beta > 0 and self.kl_in == "loss"):
            raise ValueError(f"kl_unbiased reweights the KL term of the loss: it needs kl_beta > 0 and "
                             f"kl_in='loss', got kl_beta={self.kl_beta}, kl_in={self.kl_in!r}")

    def _check_adaptive_entropy(self) -> None:
        if self.entropy_target is None:
            # a value other than the default (not merely present: a saved, dumped config names every key)
            stray = sorted(k for k in ("entropy_coef_delta", "entropy_coef_max", "entropy_coef_init")
                           if getattr(self, k) != type(self).model_fields[k].default)
            if stray:
                raise ValueError(f"{', '.join(stray)} set without entropy_target: the adaptive entropy coefficient "
                                 f"is on only with an entropy_target (e.g. 0.2)")
            return
        if self.entropy_coef != 0:
            raise ValueError(f"entropy_target={self.entropy_target} adapts the entropy coefficient: leave the fixed "
                             f"entropy_coef at 0, got {self.entropy_coef} (set entropy_coef_init instead)")
        if self.entropy_coef_init > self.entropy_coef_max:
            raise ValueError(f"entropy_coef_init ({self.entropy_coef_init}) must be <= entropy_coef_max "
                             f"({self.entropy_coef_max})")

    @property
    def adaptive_entropy(self) -> bool:
        """True when the entropy coefficient adapts from step to step (Skywork-OR1, `adaptive_entropy.py`)."""
        return self.entropy_target is not None

    @property
    def uses_critic(self) -> bool:
        """True when the advantages come from a learned value model (GAE: PPO, VAPO; `training/update/critic.py`)."""
        return self.advantage == "gae"

    @model_validator(mode="after")
    def _check_gdpo_and_process(self) -> ObjectiveConfig:
        if (self.kind == "gdpo") != (self.advantage == "gdpo_pair"):
            raise ValueError(f"kind='gdpo' and advantage='gdpo_pair' go together (gdpo.py: the advantage marks "
                             f"each group's pair), got kind={self.kind!r}, advantage={self.advantage!r}")
        if self.kind == "gdpo" and (self.kl_beta > 0 or self.kl_in != "loss" or self.needs_entropy or self.nll_coef
                                    or self.off_policy_correction is not None or self.opsm_delta is not None):
            raise ValueError("kind='gdpo' has no KL, entropy, NLL or per-token terms (gdpo_beta is its KL "
                             "regulariser): set kl_beta=0, kl_in='loss', entropy_coef=0, high_entropy_quantile=None, "
                             "nll_coef=0, off_policy_correction=None")
        if self.kind == "sft" and (self.kl_beta > 0 or self.needs_entropy or self.nll_coef or self.dynamic_sampling
                                   or self.gfpo or self.uses_critic or self.needs_step_rewards
                                   or self.off_policy_correction is not None or self.overlong_buffer is not None
                                   or self.overlong_filtering or self.multi_reward != "sum"):
            raise ValueError("kind='sft' trains on the data's responses, nothing sampled or rewarded: it takes no "
                             "KL, entropy, NLL, dynamic sampling, GFPO, critic, step rewards, off-policy correction, "
                             "overlong shaping or multi_reward (leave them at their defaults)")
        if self.process_discount != 1.0 and not self.needs_step_rewards:
            raise ValueError(f"process_discount={self.process_discount} discounts process supervision's steps: it "
                             f"needs advantage='grpo_process', not {self.advantage!r}")
        if self.needs_step_rewards and self.kl_beta > 0 and self.kl_in == "reward":
            raise ValueError("advantage='grpo_process' takes no KL in the reward: use kl_in='loss'")
        if self.needs_step_rewards and (self.overlong_buffer is not None or self.multi_reward != "sum"):
            raise ValueError("advantage='grpo_process' reads step rewards, not the outcome reward that "
                             "overlong_buffer and multi_reward shape: set overlong_buffer=None, multi_reward='sum'")
        return self

    @property
    def needs_reference(self) -> bool:
        """True when reference log-probs must be computed (beta > 0, or GDPO); DAPO-style configs need none."""
        return self.kl_beta > 0 or self.kind == "gdpo"

    @property
    def supervised(self) -> bool:
        """True when the run fine-tunes on the data's responses (kind="sft"): no rollout, no reward."""
        return self.kind == "sft"

    @property
    def needs_step_rewards(self) -> bool:
        """True when the advantage reads per-step rewards (process supervision, `process.py`)."""
        return self.advantage == "grpo_process"

    @property
    def sums_normalised_rewards(self) -> bool:
        """True when each reward function's reward is normalised in its group and then summed with its weight
        (`multi_reward="normalize_then_sum"`, GDPO / MO-GRPO): the rewards come per function, `[P, G, K]`."""
        return self.multi_reward == "normalize_then_sum"

    @property
    def uses_high_entropy_tokens(self) -> bool:
        """True when only the tokens at or above the batch's `high_entropy_quantile` of entropy are trained on."""
        return self.high_entropy_quantile is not None

    @property
    def needs_entropy(self) -> bool:
        """True when the loss needs per-token entropies."""
        return (self.entropy_coef != 0 or self.uses_high_entropy_tokens or self.entropy_driven_advantage
                or self.adaptive_entropy)

    @property
    def gfpo(self) -> bool:
        """True when GFPO keeps a subset of each group (`gfpo_keep` or `gfpo_adaptive` set)."""
        return self.gfpo_keep is not None or self.gfpo_adaptive is not None

    @property
    def needs_behaviour_logp(self) -> bool:
        """True when the loss needs the sampler's log-probs log μ (an off-policy correction or OPSM is on)."""
        return self.off_policy_correction is not None or self.opsm_delta is not None

    @property
    def needs_recomputed_old_logp(self) -> bool:
        """True when the objective compares a recomputed π_old with μ (a correction not in bypass mode)."""
        return self.off_policy_correction is not None and not self.off_policy_bypass
