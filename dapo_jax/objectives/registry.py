"""Names -> pure functions, and named recipes -> `ObjectiveConfig`.

The trainer never branches on an objective's name: it reads the config fields, and the fields name
entries of these dicts. Recipes live in `dapo_jax/configs/objectives/NAME.yaml` (keys = ObjectiveConfig fields).
"""

from __future__ import annotations

from pathlib import Path

import pydantic
import yaml

from dapo_jax.objectives import advantages, aggregation, gae, kl, off_policy, policy_loss
from dapo_jax.objectives import covariance, dppo, gdpo, gmpo, process, rollout_mismatch, sapo, supervised
from dapo_jax.objectives.config import ObjectiveConfig

ADVANTAGES = {
    "grpo": advantages.grpo,
    "dr_grpo": advantages.dr_grpo,
    "rloo": advantages.rloo,
    "reinforce_pp": advantages.reinforce_pp,
    "reinforce_pp_baseline": advantages.reinforce_pp_baseline,
    "batch_norm": advantages.batch_norm,
    "gdpo_pair": gdpo.gdpo_pair,  # marks each group's (best, worst) pair for kind="gdpo"
    "grpo_process": process.grpo_process,  # step rewards (process.StepRewards), or one step per response
    "gae": gae.gae_advantages,  # needs the critic's values: training/update/critic.py supplies them
}
POLICY_LOSSES = {
    "clipped_surrogate": policy_loss.clipped_surrogate,
    "gspo": policy_loss.gspo,
    "gspo_token": policy_loss.gspo_token,
    "cispo": policy_loss.cispo,
    # since mid-2025: these also return their own diagnostics, (loss, ratio, metrics)
    "sapo": sapo.sapo,
    "gmpo": gmpo.gmpo,
    "clip_cov": covariance.clip_cov,
    "kl_cov": covariance.kl_cov,
    "dppo_tv": dppo.dppo_tv,
    "dppo_kl": dppo.dppo_kl,
}
# policy loss -> {its keyword option: the ObjectiveConfig field that sets it}, beyond the shared ones
POLICY_LOSS_OPTIONS = {
    "sapo": {"tau_pos": "sapo_tau_pos", "tau_neg": "sapo_tau_neg"},
    "clip_cov": {"ratio": "clip_cov_ratio", "lb": "clip_cov_lb", "ub": "clip_cov_ub"},
    "kl_cov": {"ratio": "kl_cov_ratio", "coef": "kl_cov_coef"},
    "dppo_tv": {"delta_low": "dppo_delta_low", "delta_high": "dppo_delta_high", "is_cap": "dppo_is_cap"},
    "dppo_kl": {"delta_low": "dppo_delta_low", "delta_high": "dppo_delta_high", "is_cap": "dppo_is_cap"},
}
# policy losses that select tokens over the whole update batch: name -> the statistics function the
# trainer runs on a no-gradient pass (same options), whose result the loss takes as `stats=`
POLICY_LOSS_STATISTICS = {
    "clip_cov": covariance.clip_cov_statistics,
    "kl_cov": covariance.kl_cov_statistics,
}
KL_ESTIMATORS = {"k1": kl.k1, "k2": kl.k2, "k3": kl.k3}
# ObjectiveConfig.kind -> an objective of its own, called in place of the per-token policy-gradient
# loss with objective_terms' arguments and returning its (loss_sum, denominator, metrics)
OBJECTIVE_KINDS = {"gdpo": gdpo.gdpo_terms, "sft": supervised.sft_terms}
AGGREGATIONS = {
    "token_mean": aggregation.token_mean,
    "seq_mean_token_mean": aggregation.seq_mean_token_mean,
    "seq_mean_token_sum": aggregation.seq_mean_token_sum,
    "group_mean_token_mean": aggregation.group_mean_token_mean,
    "constant_norm": aggregation.constant_norm,
}
OFF_POLICY_CORRECTIONS = {
    "token_tis": off_policy.token_tis,
    "seq_tis": off_policy.seq_tis,
    "token_mask": off_policy.token_mask,
    "seq_mask": off_policy.seq_mask,
    "geo_seq_mask": rollout_mismatch.geo_seq_mask,
    "icepop": rollout_mismatch.icepop,
    "k3_seq_mask": rollout_mismatch.k3_seq_mask,
}
_BAND = {"cap": "off_policy_cap", "cap_low": "off_policy_cap_low"}
# correction -> {its keyword option: the ObjectiveConfig field that sets it}
OFF_POLICY_OPTIONS = {name: _BAND for name in OFF_POLICY_CORRECTIONS} | {
    "k3_seq_mask": {"k3_threshold": "off_policy_k3_threshold"}}


def options(cfg: ObjectiveConfig, table: dict, name: str) -> dict:
    """The keyword options `table[name]` names, read from `cfg` ({} for a name with none)."""
    return {kw: getattr(cfg, field) for kw, field in table.get(name, {}).items()}

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs" / "objectives"  # packaged with the code


def available_objectives() -> list[str]:
    """The recipe names in CONFIG_DIR, sorted."""
    return sorted(p.stem for p in CONFIG_DIR.glob("*.yaml"))


def _resolve(name_or_path: str) -> Path:
    path = Path(name_or_path)
    if path.suffix in (".yaml", ".yml") or path.is_file():
        if not path.is_file():
            raise FileNotFoundError(f"objective config file {path} does not exist")
        return path
    path = CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        raise ValueError(
            f"unknown objective {name_or_path!r}; valid names: {', '.join(available_objectives())} "
            f"(from {CONFIG_DIR}), or a path to a .yaml file"
        )
    return path


def load_objective(name_or_path: str, **overrides) -> ObjectiveConfig:
    """Load a named recipe (`dapo_jax/configs/objectives/NAME.yaml`) or a YAML file, then apply `overrides`.

    Unknown keys fail naming the key and the file (or "overrides"); invalid values fail with
    pydantic's error, which names the field, prefixed by the file.
    """
    path = _resolve(name_or_path)
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of ObjectiveConfig fields, got {type(data).__name__}")
    fields = set(ObjectiveConfig.model_fields)
    for source, keys in ((str(path), data), ("overrides", overrides)):
        unknown = sorted(set(keys) - fields)
        if unknown:
            raise ValueError(f"unknown ObjectiveConfig key(s) {unknown} in {source}; valid keys: {sorted(fields)}")
    data.setdefault("name", path.stem)
    try:
        return ObjectiveConfig(**{**data, **overrides})
    except pydantic.ValidationError as err:
        raise ValueError(f"{path}: invalid objective config: {err}") from err
