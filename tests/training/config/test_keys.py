"""The dotted keys of a config model, and the "did you mean" an unknown key gets, on a small model tree
written here (so the expected answers are read off the tree, not off the real config)."""

from pydantic import BaseModel

from dapo_jax.training.config.keys import PEER_KEYS, all_keys, section_model, suggest


class _Inner(BaseModel):
    lr: float = 1.0
    warmup_steps: int = 0


class _Fn(BaseModel):
    name: str = "x"
    weight: float = 1.0


class _Root(BaseModel):
    optim: _Inner = _Inner()
    critic: _Inner | None = None
    functions: list[_Fn] = []
    steps: int = 1


def test_section_model_finds_the_section_inside_an_annotation():
    assert section_model(_Inner) is _Inner and section_model(_Inner | None) is _Inner
    assert section_model(list[_Fn]) is _Fn and section_model(dict[str, _Fn]) is _Fn
    assert section_model(int) is None and section_model(int | None) is None


def test_all_keys_lists_every_leaf_with_its_dotted_path():
    assert all_keys(_Root) == ["optim.lr", "optim.warmup_steps", "critic.lr", "critic.warmup_steps",
                               "functions.name", "functions.weight", "steps"]


def test_suggest_a_near_spelling_the_initials_another_section_or_nothing():
    assert suggest(("optim", "lrr"), _Root) == " (did you mean 'optim.lr'?)"  # a typo in its own section
    assert suggest(("optim", "learning_rate"), _Root) == " (did you mean 'optim.lr'?)"  # l(earning)_r(ate)
    assert suggest(("functions", 0, "wieght"), _Root) == " (did you mean 'functions.0.weight'?)"
    assert suggest(("functions", 0, "lr"), _Root) == " (did you mean 'optim.lr'?)"  # the key of another section
    assert suggest(("optim", "zzz"), _Root) == ""
    assert suggest(("nowhere", "lr"), _Root) == ""  # an unknown section: its keys are unknown


def test_suggest_names_the_key_other_trainers_call_by_another_name():
    assert PEER_KEYS["num_generations"] == "rollout.G"
    assert suggest(("num_generations",), _Root) == (" (did you mean 'rollout.G'? 'num_generations' is what other "
                                                    "trainers call it)")
