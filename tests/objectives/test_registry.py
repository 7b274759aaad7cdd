"""Registry dicts and the named recipes in dapo_jax/configs/objectives/."""

import inspect

import pytest

from dapo_jax.objectives import registry
from dapo_jax.objectives.config import ObjectiveConfig

RECIPES = ["grpo", "dapo", "dr_grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline", "gspo", "gspo_token", "cispo"]


def test_every_recipe_exists_and_loads():
    assert set(RECIPES) <= set(registry.available_objectives())
    for name in registry.available_objectives():
        cfg = registry.load_objective(name, max_response_length=8192)
        assert isinstance(cfg, ObjectiveConfig) and cfg.name == name


def test_published_operating_points():
    dapo = registry.load_objective("dapo")
    assert (dapo.eps_low, dapo.eps_high, dapo.loss_agg, dapo.kl_beta) == (0.2, 0.28, "token_mean", 0.0)
    assert dapo.dynamic_sampling and dapo.overlong_buffer == 4096 and dapo.overlong_penalty_factor == 1.0
    assert (dapo.reward_correct, dapo.reward_wrong, dapo.overlong_filtering) == (1.0, -1.0, False)
    assert not dapo.needs_reference
    grpo = registry.load_objective("grpo")
    assert (grpo.eps_low, grpo.eps_high, grpo.loss_agg) == (0.2, 0.2, "seq_mean_token_mean")
    assert (grpo.kl_estimator, grpo.kl_beta, grpo.kl_in, grpo.reward_wrong) == ("k3", 0.04, "loss", 0.0)
    dr = registry.load_objective("dr_grpo")
    assert (dr.advantage, dr.loss_agg, dr.kl_beta) == ("dr_grpo", "constant_norm", 0.0)
    gspo = registry.load_objective("gspo")
    assert (gspo.policy_loss, gspo.eps_low, gspo.eps_high) == ("gspo", 3e-4, 4e-4)
    assert registry.load_objective("cispo").policy_loss == "cispo"
    assert registry.load_objective("reinforce_pp").kl_in == "reward"


def test_registry_keys_cover_the_config_literals():
    for field, table in (("advantage", registry.ADVANTAGES), ("policy_loss", registry.POLICY_LOSSES),
                         ("loss_agg", registry.AGGREGATIONS), ("kl_estimator", registry.KL_ESTIMATORS)):
        assert set(ObjectiveConfig.model_fields[field].annotation.__args__) == set(table), field
    # one keyword signature per table, so the loss can call any entry; an entry may take more
    # (the critic's `gae` takes its values and GAE knobs), but only with defaults
    for table in (registry.ADVANTAGES, registry.POLICY_LOSSES, registry.AGGREGATIONS, registry.KL_ESTIMATORS):
        sigs = {name: inspect.signature(f).parameters for name, f in table.items()}
        common = min(sigs.values(), key=len)
        for name, params in sigs.items():
            assert tuple(params)[:len(common)] == tuple(common), (name, tuple(params))
            extra = list(params.values())[len(common):]
            assert all(p.default is not inspect.Parameter.empty for p in extra), (name, extra)


def test_unknown_name_lists_valid_names():
    with pytest.raises(ValueError) as err:
        registry.load_objective("ppo2")
    for name in RECIPES:
        assert name in str(err.value)


def test_unknown_key_names_key_and_file(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("eps_low: 0.2\nclip_ratio: 0.3\n")
    with pytest.raises(ValueError, match=r"clip_ratio.*mine\.yaml"):
        registry.load_objective(str(path))
    with pytest.raises(ValueError, match=r"bogus.*overrides"):
        registry.load_objective("dapo", bogus=1)


def test_invalid_value_names_field_and_file(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("eps_low: 0.3\neps_high: -0.2\n")
    with pytest.raises(ValueError, match=r"bad\.yaml(.|\n)*eps_high"):
        registry.load_objective(str(path))
    with pytest.raises(ValueError, match="dual_clip_c"):
        registry.load_objective("dapo", dual_clip_c=0.5)


def test_overrides_and_file_path(tmp_path):
    cfg = registry.load_objective("dapo", eps_high=0.3, max_response_length=512, overlong_buffer=128)
    assert (cfg.eps_high, cfg.max_response_length, cfg.overlong_buffer) == (0.3, 512, 128)
    path = tmp_path / "x.yaml"
    path.write_text("")
    assert registry.load_objective(str(path)) == ObjectiveConfig(name="x")
    with pytest.raises(FileNotFoundError, match="nope.yaml"):
        registry.load_objective(str(tmp_path / "nope.yaml"))
