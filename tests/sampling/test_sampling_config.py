"""SamplingConfig: validation, hashability (it is a static jit argument), derived flags."""

import pytest

from dapo_jax.sampling import SamplingConfig, SamplingConfigError


def test_defaults_and_hashable():
    c = SamplingConfig(max_new_tokens=8, eos_token_ids=[2, 3], pad_token_id=0)
    assert c.eos_token_ids == (2, 3)  # lists are normalised to a tuple so the config hashes
    assert hash(c) == hash(SamplingConfig(max_new_tokens=8, eos_token_ids=(2, 3)))
    assert not c.is_greedy and not c.truncates and c.logprob_temperature == 1.0
    assert SamplingConfig(max_new_tokens=1, eos_token_ids=7).eos_token_ids == (7,)


def test_derived_flags():
    assert SamplingConfig(max_new_tokens=1, temperature=0.0).is_greedy
    assert SamplingConfig(max_new_tokens=1, temperature=0.0).logprob_temperature == 1.0
    assert SamplingConfig(max_new_tokens=1, greedy=True, temperature=0.6).logprob_temperature == 0.6
    assert SamplingConfig(max_new_tokens=1, top_k=5).truncates
    assert SamplingConfig(max_new_tokens=1, top_p=0.9).truncates


@pytest.mark.parametrize("field, value", [
    ("max_new_tokens", 0), ("temperature", -0.1), ("temperature", float("nan")), ("top_p", 0.0),
    ("top_p", 1.5), ("top_k", -1), ("top_k", 2.5), ("eos_token_ids", (-1,)), ("pad_token_id", -3),
])
def test_bad_values_name_the_field(field, value):
    kwargs = {"max_new_tokens": 4, field: value}
    with pytest.raises(SamplingConfigError, match=field):
        SamplingConfig(**kwargs)
