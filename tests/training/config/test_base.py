"""The shared base of the config sections: unknown keys and non-finite numbers refused, a keyed error's
message, and the "did you mean" of a near word."""

import pydantic
import pytest

from dapo_jax.training.config.base import KeyedError, Section, did_you_mean


class _Tiny(Section):
    lr: float = 1.0


def test_a_section_is_frozen_and_refuses_unknown_keys_and_non_finite_numbers():
    assert _Tiny(lr=2.0).lr == 2.0
    for bad in ({"lrr": 1.0}, {"lr": float("inf")}, {"lr": float("nan")}):
        with pytest.raises(pydantic.ValidationError):
            _Tiny(**bad)
    with pytest.raises(pydantic.ValidationError):
        _Tiny().lr = 3.0


def test_a_keyed_error_carries_its_key_and_message():
    e = KeyedError("sources.a", "an empty mixture")
    assert (e.key, e.msg, str(e)) == ("sources.a", "an empty mixture", "sources.a: an empty mixture")
    assert isinstance(e, ValueError)  # pydantic turns a ValueError in a validator into a validation error


def test_did_you_mean_names_the_closest_word_or_nothing():
    assert did_you_mean("eps_hgh", ["eps_low", "eps_high"]) == " (did you mean 'eps_high'?)"
    assert did_you_mean("zzz", ["eps_low", "eps_high"]) == ""
