"""Typed config: shipped configs load, overrides parse with YAML, errors name the key and the file."""


from pathlib import Path

import pytest
import yaml

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.overrides import parse_overrides
from dapo_jax.training.config.paths import CONFIG_DIR, DEFAULT_CONFIG, PACKAGE_DIR, find_config
from dapo_jax.training.config.resolve import is_resolved, resolve, resolved_keys
from dapo_jax.training.config.run import RunConfig, config_from_dict, load_config, save_config

SHIPPED = sorted(CONFIG_DIR.glob("*.yaml"))


def test_shipped_configs_exist():
    names = {p.name for p in SHIPPED}
    assert {"tiny_dapo.yaml", "tiny_grpo.yaml", "tiny_dr_grpo.yaml", "qwen2.5-0.5b-gsm8k-dapo.yaml",
            "qwen2.5-32b-dapo-math.yaml", "deepseekmath-grpo.yaml"} <= names
    assert DEFAULT_CONFIG.name == "tiny_dapo.yaml"


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, RunConfig)
    obj = cfg.objective_config
    assert obj.max_response_length >= cfg.rollout.max_new_tokens
    # The resolved config reloads to the same objective and sections.
    again = config_from_dict(yaml.safe_load(cfg.to_yaml()))
    assert again.objective_config == obj
    assert again.rollout == cfg.rollout and again.optim == cfg.optim


def test_dapo_paper_recipe_numbers():
    cfg = load_config(CONFIG_DIR / "qwen2.5-32b-dapo-math.yaml")
    r, o, obj = cfg.rollout, cfg.optim, cfg.objective_config
    assert (r.G, r.train_batch) == (16, 512)
    # DAPO's budget of 10 rounds of 1536 prompts, in rounds whose KV cache fits (docs/long_context.md)
    assert (r.gen_batch, r.gen_batch * r.max_gen_batches) == (8, 1536 * 10)
    assert (o.lr, o.warmup_steps, o.weight_decay, o.grad_clip, o.num_minibatches) == (1e-6, 20, 0.1, 1.0, 16)
    assert (obj.eps_low, obj.eps_high, obj.kl_beta, obj.loss_agg) == (0.2, 0.28, 0.0, "token_mean")
    assert (obj.max_response_length, obj.overlong_buffer, obj.dynamic_sampling) == (20480, 4096, True)


def test_overrides_are_parsed_as_yaml():
    assert parse_overrides(["a.b=3", "c=[1, 2]", "d=true", "e=x"]) == [("a.b", 3), ("c", [1, 2]), ("d", True), ("e", "x")]
    cfg = load_config(None, ["rollout.G=4", "optim.lr=3e-4", "objective.eps_high=0.3", "train.run_dir=/tmp/x"])
    assert cfg.rollout.G == 4 and cfg.optim.lr == 3e-4 and cfg.objective_config.eps_high == 0.3
    with pytest.raises(ConfigError, match="key.sub=value"):
        parse_overrides(["novalue"])


def test_objective_equals_name_is_that_recipe_as_shipped():
    """`objective=grpo` on a DAPO config trains GRPO's recipe: none of the file's DAPO keys (its overlong
    punishment) ride along (issue 47); `objective.name=grpo` keeps them, as overrides of GRPO's recipe."""
    shipped = yaml.safe_load((CONFIG_DIR / "objectives" / "grpo.yaml").read_text())
    cfg = load_config(CONFIG_DIR / "cot_dapo.yaml", ["objective=grpo"])  # cot_dapo sets overlong_buffer 16
    assert cfg.objective.name == "grpo" and cfg.objective.overrides == {}
    built = cfg.objective_config
    assert built.overlong_buffer is None and built.dynamic_sampling is False and built.eps_high == 0.2
    assert all(getattr(built, k) == v for k, v in shipped.items() if k != "max_response_length")
    kept = load_config(CONFIG_DIR / "cot_dapo.yaml", ["objective.name=grpo"])
    assert kept.objective.name == "grpo" and kept.objective_config.overlong_buffer == 16
    assert kept.objective_config.dynamic_sampling is False  # grpo's recipe, with the file's keys on top
    assert parse_overrides(["objective=grpo"]) == [("objective", {"name": "grpo"})]
    assert parse_overrides(["objective={name: gspo}"]) == [("objective", {"name": "gspo"})]  # a mapping: as before


def test_an_override_that_is_not_yaml_is_one_line_naming_it():
    bad = "reward.functions=[{name: gsm8k}"
    with pytest.raises(ConfigError) as info:
        load_config("tiny_dapo", [bad])
    assert str(info.value).startswith(f"override {bad!r}: the value is not valid YAML")
    assert "\n" not in str(info.value)


def _error(tmp_path, text=None, overrides=()):
    path = tmp_path / "bad.yaml"
    path.write_text(text if text is not None else DEFAULT_CONFIG.read_text())
    with pytest.raises(ConfigError) as info:
        load_config(path, list(overrides))
    msg = str(info.value)
    assert str(path) in msg
    return msg


@pytest.mark.parametrize("overrides, key", [
    (["rollout.bogus=1"], "rollout.bogus"),
    (["bogus_section.x=1"], "bogus_section"),
    (["rollout.G=1"], "rollout.G"),
    (["rollout.G=abc"], "rollout.G"),
    (["optim.lr=-1"], "optim.lr"),
    (["rollout.train_batch=6", "optim.num_minibatches=4"], "rollout.train_batch"),
    (["mesh.data=3"], "rollout.train_batch"),
    (["rollout.gen_batch=2", "rollout.max_gen_batches=1"], "rollout.max_gen_batches"),
    (["rollout.on_starvation=maybe"], "rollout.on_starvation"),
    (["reward.functions=[{name: nope}]"], "reward.functions.0.name"),
    (["objective.name=no_such_objective"], "objective"),
    (["objective.eps_high=-0.1"], "eps_high"),
    (["critic.epochs=2"], "critic.epochs"),
    (["optim.epochs=0"], "optim.epochs"),
    (["objective.name=ppo", "critic.epochs=3"], "critic.epochs"),
    (["objective.not_a_field=1"], "not_a_field"),
    (["optim.packing_tail_rows=-1"], "optim.packing_tail_rows"),
    (["mesh.data=2", "optim.packing_tail_rows=3"], "optim.packing_tail_rows"),
])
def test_errors_name_the_key_and_file(tmp_path, overrides, key):
    assert key in _error(tmp_path, overrides=overrides)


def test_bad_yaml_and_missing_file(tmp_path):
    assert "not valid YAML" in _error(tmp_path, "model: [unclosed")
    assert "mapping" in _error(tmp_path, "- a\n- b\n")
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "absent.yaml")


def test_recipes_ship_in_the_package_and_are_found_by_name_or_by_their_old_path(tmp_path, monkeypatch):
    assert CONFIG_DIR == PACKAGE_DIR / "configs" and (CONFIG_DIR / "objectives" / "dapo.yaml").is_file()
    monkeypatch.chdir(tmp_path)  # not the checkout: nothing relative to it exists here
    for typed in ("cot_dapo", "cot_dapo.yaml", "configs/cot_dapo.yaml"):
        assert find_config(typed) == CONFIG_DIR / "cot_dapo.yaml"
    assert find_config("qwen2.5-0.5b-gsm8k-dapo") == CONFIG_DIR / "qwen2.5-0.5b-gsm8k-dapo.yaml"  # dots in the name
    assert load_config("configs/tiny_grpo.yaml").objective.name == "grpo"
    (tmp_path / "configs").mkdir()  # a file of the user's own at that path wins over the recipe
    (tmp_path / "configs" / "cot_dapo.yaml").write_text("objective: {name: grpo}\n")
    assert find_config("configs/cot_dapo.yaml") == Path("configs/cot_dapo.yaml")
    assert load_config("configs/cot_dapo.yaml").objective.name == "grpo"
    with pytest.raises(ConfigError, match=r"tiny_dap.yaml does not exist \(did you mean 'tiny_dapo'\?\).*cot_dapo"):
        load_config("configs/tiny_dap.yaml")


@pytest.mark.parametrize("override, message", [
    ("optim.learning_rate=1e-4", "optim.learning_rate: unknown key (did you mean 'optim.lr'?)"),  # initials
    ("optim.lrr=1e-4", "optim.lrr: unknown key (did you mean 'optim.lr'?)"),  # a typo
    ("rollout.lr=1e-4", "rollout.lr: unknown key (did you mean 'optim.lr'?)"),  # another section's key
    ("trian.steps=3", "trian: unknown key (did you mean 'train'?)"),
    ("reward.functions=[{name: cot, wieght: 2}]", "reward.functions.0.wieght: unknown key (did you mean "
                                                  "'reward.functions.0.weight'?)"),
    ("objective.eps_hgh=0.3", "objective.eps_hgh: unknown objective key (did you mean 'eps_high'?)"),
    ("rollout.zzz=1", "rollout.zzz: unknown key ("),  # nothing close: no suggestion
])
def test_an_unknown_key_gets_a_did_you_mean(tmp_path, override, message):
    msg = _error(tmp_path, overrides=[override])
    if message.endswith("("):
        assert message[:-2] in msg and "did you mean" not in msg
    else:
        assert message in msg


def test_an_overlong_band_longer_than_the_response_names_the_knob_and_who_set_the_band(tmp_path):
    # The band (objective.overlong_buffer) set by the run config's file, by the command line, or by the recipe:
    msg = _error(tmp_path, overrides=["rollout.max_new_tokens=1"])  # tiny_dapo.yaml sets overlong_buffer: 2
    assert "rollout.max_new_tokens: 1 is shorter than objective.overlong_buffer=2" in msg
    assert f"set in {tmp_path / 'bad.yaml'}'s objective section" in msg and "objective.overlong_buffer=null" in msg
    msg = _error(tmp_path, overrides=["objective.overlong_buffer=8"])
    assert "rollout.max_new_tokens: 6 is shorter than objective.overlong_buffer=8 (set on the command line)" in msg
    msg = _error(tmp_path, text="rollout: {max_new_tokens: 64}\n")  # the dapo recipe's band, 4096 tokens
    assert ("rollout.max_new_tokens: 64 is shorter than objective.overlong_buffer=4096 (set by the objective "
            "recipe 'dapo' (dapo_jax/configs/objectives/dapo.yaml))") in msg
    assert "pydantic" not in msg and "\n" not in msg
    msg = _error(tmp_path, text="objective: {name: dapo, max_response_length: 8, overlong_buffer: 10}\n")
    assert "objective.max_response_length: 8 is shorter than objective.overlong_buffer=10" in msg
    assert load_config(None, ["rollout.max_new_tokens=1", "objective.overlong_buffer=null"]).rollout.max_new_tokens == 1


def test_saved_config_reloads(tmp_path):
    cfg = load_config(None, [f"train.run_dir={tmp_path}"])
    out = save_config(cfg, tmp_path)
    assert out == tmp_path / "config.yaml"
    again = load_config(tmp_path)  # a run dir loads its config.yaml
    assert again.objective_config == cfg.objective_config and again.model_dump() == cfg.model_dump() | {
        "objective": again.model_dump()["objective"]}


def test_relative_paths_in_a_config_file_resolve_beside_it(tmp_path, monkeypatch):
    (tmp_path / "exp" / "data").mkdir(parents=True)
    (tmp_path / "exp" / "data" / "train.jsonl").write_text("{}\n")
    (tmp_path / "exp" / "run.yaml").write_text(
        "data:\n  train: {name: data/train.jsonl, format: gsm8k}\n  eval: {name: data/missing.jsonl, format: gsm8k}\n"
        "objective: {name: dapo, overlong_buffer: 4}\n")
    monkeypatch.chdir(tmp_path)  # somewhere else: the file's own directory still anchors its paths
    cfg = load_config(tmp_path / "exp" / "run.yaml")
    assert cfg.data.train.name == str((tmp_path / "exp" / "data" / "train.jsonl").resolve())
    assert cfg.data.eval.name == "data/missing.jsonl"  # not beside the file: left to the working dir / checkout
    assert cfg.model.path == "dapo_jax/assets/tiny_base"  # found in the checkout, as before
    # Overrides are relative to the working directory, as typed in a shell.
    assert load_config(tmp_path / "exp" / "run.yaml", ["data.train.name=data/x.jsonl"]).data.train.name == "data/x.jsonl"


def test_pointing_the_default_config_at_a_file_drops_the_tasks_options():
    cfg = load_config(None, ["data.train.name=gsm8k/train.jsonl", "data.train.format=gsm8k"])
    assert cfg.data.train.options == {} and cfg.data.eval.options  # only the overridden source changes
    kept = load_config(None, ["data.train.name=synthetic", "data.train.options={max_operand: 9}"])
    assert kept.data.train.options == {"max_operand": 9}


def test_gsm8k_recipe_runs_its_data_checks_on_real_gsm8k(shared):
    """The recipe with GSM8K and the Qwen2.5 tokenizer: every prompt fits, the reward scores the answers."""
    from dapo_jax.models.hf_io import load_tokenizer
    from dapo_jax.training.run_data import make_data

    cfg = load_config(CONFIG_DIR / "qwen2.5-0.5b-gsm8k-dapo.yaml",
                      [f"data.train.name={shared('data', 'gsm8k', 'train.jsonl')}",
                       f"data.eval.name={shared('data', 'gsm8k', 'test.jsonl')}"])
    stream, eval_stream, _ = make_data(cfg, load_tokenizer(shared("tokenizers", "qwen2.5")), cfg.objective_config)
    assert len(stream) + stream.num_skipped == 7473 and stream.num_skipped < 10
    assert len(eval_stream) == 1319 and "<|im_start|>user" in eval_stream.examples[0].text


def test_gsm8k_recipe_without_downloads_says_what_to_do():
    from dapo_jax.training.sources import DataError, load_source

    cfg = load_config(CONFIG_DIR / "qwen2.5-0.5b-gsm8k-dapo.yaml")
    with pytest.raises(DataError, match=r"data/gsm8k/train.jsonl: no such file .*Bring your own model and data"):
        load_source(cfg.data.train)


def test_a_partial_critic_section_takes_optims_values_for_the_keys_it_does_not_name():
    cfg = load_config(CONFIG_DIR / "tiny_vapo.yaml", ["critic={lr: 1.0e-3}"])
    assert cfg.critic_optim.lr == 1e-3
    assert cfg.critic_optim.weight_decay == cfg.optim.weight_decay == 0.0  # not CriticSection's default 0.1
    assert cfg.critic_optim.warmup_steps == cfg.optim.warmup_steps == 5
    assert load_config(CONFIG_DIR / "tiny_vapo.yaml").critic_optim.warmup_steps == 0  # named in the file


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_recipe_resolves_to_the_fast_exact_paths(path):
    """A recipe that leaves optim.packing / rollout.compaction unset gets both (they compute the same update and
    rollout as the plain paths); what a recipe names is kept."""
    raw = yaml.safe_load(path.read_text())
    cfg = resolve(load_config(path))
    named_packing = (raw.get("optim") or {}).get("packing")
    named_compaction = (raw.get("rollout") or {}).get("compaction")
    assert cfg.optim.packing is (True if named_packing is None else named_packing)
    halves = cfg.rollout.gen_batch * cfg.rollout.G // 2 >= cfg.rollout.compaction_min_rows
    expected = (not cfg.rollout.continuous and halves) if named_compaction is None else named_compaction
    assert cfg.rollout.compaction is expected


@pytest.mark.parametrize("overrides, packing, compaction", [
    ([], True, True),  # neither named: both on
    (["optim.packing=false", "rollout.compaction=false"], False, False),  # named: kept
    (["objective.name=gdpo", "objective.overlong_buffer=null"], False, True),  # group DPO's metric needs the padded layout
    (["rollout.continuous=true"], True, False),  # continuous batching is compaction's alternative
    (["rollout.G=4", "rollout.compaction_min_rows=10000"], True, False),  # too few rows to halve
])
def test_unset_fast_paths_resolve_where_they_apply(overrides, packing, compaction):
    """Validation leaves what a config does not name unset; `resolve`, the one step after it, chooses, says
    what it chose, and a resolved config (saved and reloaded) resolves to itself."""
    loaded = load_config("tiny_dapo", ["optim.packing=null", "rollout.compaction=null", *overrides])
    named = {key: value for key, value in (o.split("=") for o in overrides)}
    unset = {key: value for key, value in (("optim.packing", packing), ("rollout.compaction", compaction))
             if key not in named}  # what the config leaves to `resolve`
    assert {k for k in unset if getattr(getattr(loaded, k.split(".")[0]), k.split(".")[1]) is None} == set(unset)
    assert is_resolved(loaded) == (not unset)
    cfg = resolve(loaded)
    assert (cfg.optim.packing, cfg.rollout.compaction) == (packing, compaction) and is_resolved(cfg)
    assert resolved_keys(loaded, cfg) == unset
    assert f"packing: {str(packing).lower()}" in cfg.to_yaml()  # RUN_DIR/config.yaml shows the choice
    again = config_from_dict(cfg.model_dump())  # the saved, resolved config reloads to the same paths
    assert (again.optim.packing, again.rollout.compaction) == (packing, compaction)
    assert resolve(again) == again and resolved_keys(again, resolve(again)) == {}


def test_stop_at_accuracy_needs_evaluations():
    with pytest.raises(Exception, match="train.eval_every"):
        load_config(None, ["train.stop_at_accuracy=0.3", "train.eval_every=0"])
    assert load_config(None, ["train.stop_at_accuracy=0.3", "train.eval_every=10"]).train.stop_at_accuracy == 0.3


def test_optim_epochs_are_the_policys_the_critic_inherits_the_rest():
    cfg = load_config(None, ["optim.epochs=2", "optim.lr=3e-4"])
    assert cfg.optim.epochs == 2 and cfg.critic_optim.epochs == 1 and cfg.critic_optim.lr == 3e-4
    partial = load_config(None, ["optim.epochs=2", "optim.lr=3e-4", "critic.num_minibatches=2"])  # a critic section
    assert partial.critic_optim.epochs == 1 and partial.critic_optim.lr == 3e-4
