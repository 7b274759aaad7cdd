"""The data section: one source or a mixture of named sources, never both; a recipe's data.train switched
off with null beside a mixture."""

import pydantic
import pytest

from dapo_jax.training.config.data import DataSection, MixtureSource, SourceSection
from dapo_jax.training.config.reward import RewardFunction, RewardSection


def _keyed(**fields):
    with pytest.raises(pydantic.ValidationError) as info:
        DataSection(**fields)
    return info.value.errors()[0]["ctx"]["error"].key


def test_a_mixture_of_named_sources_with_their_own_rewards():
    data = DataSection(sources={"gsm8k": {"weight": 2.0, "train": {"name": "g.jsonl", "format": "gsm8k"},
                                          "reward": {"functions": [{"name": "gsm8k"}]}},
                                "cot-2": {}})
    assert data.sources["gsm8k"] == MixtureSource(weight=2.0, train=SourceSection(name="g.jsonl", format="gsm8k"),
                                                  reward=RewardSection(functions=[RewardFunction(name="gsm8k")]))
    assert data.sources["cot-2"].reward is None and data.train == SourceSection()


def test_a_mixture_is_named_non_empty_and_replaces_data_train():
    assert _keyed(sources={}) == "sources"
    assert _keyed(sources={"a b": {}}) == "sources.a b"  # names metrics: source/NAME/accuracy
    assert _keyed(sources={"a": {}}, train={"name": "x.jsonl"}) == "train"
    assert DataSection(sources={"a": {}}, train=None).train == SourceSection()  # switched off: the default, unread
    with pytest.raises(pydantic.ValidationError):
        DataSection(train=None)  # without a mixture, null is not a source
    with pytest.raises(pydantic.ValidationError):
        DataSection(sources={"a": {"weight": 0}})
