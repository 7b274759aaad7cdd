"""Temperature / top-k / top-p / greedy token draws against NumPy references and known frequencies."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dapo_jax.sampling import SamplingConfig, sample_tokens, tempered_logprobs, truncation_mask


def np_log_softmax(z):
    z = np.asarray(z, np.float64)
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))


def np_keep(logits, top_k, top_p):
    """Reference truncation, one row at a time with an explicit sort (distinct logits)."""
    logits = np.asarray(logits, np.float64)
    keep = np.zeros(logits.shape, bool)
    for i, row in enumerate(logits):
        order = np.argsort(-row)
        if top_k > 0:
            order = order[:top_k]
        p = np.exp(row[order] - row[order].max())
        p /= p.sum()
        before = 0.0
        for j, idx in enumerate(order):
            if j > 0 and before >= top_p:
                break
            keep[i, idx] = True
            before += p[j]
    return keep


def test_tempered_logprobs_matches_numpy():
    z = np.random.default_rng(0).normal(size=(3, 11)).astype(np.float32) * 3
    for tau in (0.5, 1.0, 1.7):
        got = tempered_logprobs(jnp.asarray(z), temperature=tau)
        assert got.dtype == jnp.float32
        np.testing.assert_allclose(got, np_log_softmax(z / tau), atol=1e-6)
    got_bf16 = tempered_logprobs(jnp.asarray(z, jnp.bfloat16), temperature=0.7)
    assert got_bf16.dtype == jnp.float32  # bf16 logits are upcast before the softmax
    np.testing.assert_allclose(got_bf16, np_log_softmax(np.asarray(jnp.asarray(z, jnp.bfloat16), np.float32) / 0.7),
                               atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(
    seed=st.integers(0, 2**31 - 1),
    vocab=st.sampled_from([2, 9, 33]),  # few shapes: each new (shape, k) compiles
    top_k=st.sampled_from([0, 1, 2, 5, 33, 40]),
    top_p=st.floats(0.05, 1.0),
)
def test_truncation_mask_matches_sorted_reference(seed, vocab, top_k, top_p):
    rng = np.random.default_rng(seed)
    logits = rng.permutation(np.linspace(-4, 4, vocab))[None] + rng.normal(size=(4, vocab)) * 1e-3
    logits = logits.astype(np.float32)
    logp = tempered_logprobs(jnp.asarray(logits), temperature=1.0)
    got = np.asarray(truncation_mask(logp, top_k=top_k, top_p=top_p))
    np.testing.assert_array_equal(got, np_keep(np.asarray(logp), top_k, top_p))
    assert got[np.arange(4), logits.argmax(-1)].all()  # the top token always survives


def test_top_p_boundary_is_the_smallest_set_reaching_p():
    probs = np.array([[0.5, 0.3, 0.15, 0.05]])
    logp = jnp.asarray(np.log(probs), jnp.float32)
    # cumulative 0.5, 0.8, 0.95, 1.0
    assert np.asarray(truncation_mask(logp, top_p=0.5)).tolist() == [[True, False, False, False]]
    assert np.asarray(truncation_mask(logp, top_p=0.51)).tolist() == [[True, True, False, False]]
    assert np.asarray(truncation_mask(logp, top_p=0.9)).tolist() == [[True, True, True, False]]
    assert np.asarray(truncation_mask(logp, top_p=0.01)).tolist() == [[True, False, False, False]]
    assert np.asarray(truncation_mask(logp, top_k=2, top_p=0.7)).tolist() == [[True, True, False, False]]
    # top-p after top-k works on the renormalised top-2 (0.625, 0.375): mass before the 2nd is 0.625 >= 0.62
    assert np.asarray(truncation_mask(logp, top_k=2, top_p=0.62)).tolist() == [[True, False, False, False]]


PROBS = np.array([0.30, 0.22, 0.16, 0.12, 0.09, 0.06, 0.03, 0.02])
N = 40_000


def _draw(config, logits=None, n=N, seed=0):
    z = np.log(PROBS) if logits is None else logits
    batch = jnp.broadcast_to(jnp.asarray(z, jnp.float32), (n, z.shape[-1]))
    return jax.jit(lambda k, x: sample_tokens(k, x, config=config))(jax.random.key(seed), batch)


def _chi_square_ok(tokens, expected):
    """Counts outside the support must be zero; inside, a chi-square test at p = 1e-4."""
    counts = np.bincount(np.asarray(tokens), minlength=len(expected))
    support = expected > 0
    assert counts[~support].sum() == 0, f"sampled outside the allowed set: {counts}"
    stat, pvalue = stats.chisquare(counts[support], N * expected[support] / expected[support].sum())
    assert pvalue > 1e-4, (counts, N * expected, pvalue)


@pytest.mark.parametrize(
    "top_k, top_p, tau, support",
    [
        (0, 1.0, 1.0, 8),  # plain sampling
        (3, 1.0, 1.0, 3),
        (0, 0.6, 1.0, 3),  # mass before: 0, .30, .52 (< .6) -> 3 tokens
        (4, 0.5, 1.0, 2),  # top-4 renormalised (.375, .275, ...) -> before .375 < .5 -> 2 tokens
        (0, 1.0, 0.5, 8),
        (5, 0.8, 2.0, 4),  # tempered top-5 renormalised: mass before the 5th is .855
    ],
)
def test_sample_frequencies_and_logprobs(top_k, top_p, tau, support):
    config = SamplingConfig(max_new_tokens=1, temperature=tau, top_k=top_k, top_p=top_p)
    tokens, logprob, sampled_logprob = _draw(config)
    full = np_log_softmax(np.log(PROBS) / tau)
    expected = np.exp(full)
    keep = np_keep(full[None], top_k, top_p)[0]
    assert keep.sum() == support
    q = np.where(keep, expected, 0.0)
    q /= q.sum()
    _chi_square_ok(tokens, q)
    tokens = np.asarray(tokens)
    np.testing.assert_allclose(logprob, full[tokens], atol=1e-5)
    np.testing.assert_allclose(sampled_logprob, np.log(q[tokens]), atol=1e-5)
    if support == 8:
        np.testing.assert_array_equal(logprob, sampled_logprob)


@pytest.mark.parametrize("config", [
    SamplingConfig(max_new_tokens=1, greedy=True, temperature=0.7, top_k=3),
    SamplingConfig(max_new_tokens=1, temperature=0.0),
])
def test_greedy_and_temperature_zero_take_the_argmax(config):
    z = np.random.default_rng(1).normal(size=(16, 30)).astype(np.float32)
    tokens, logprob, sampled_logprob = jax.jit(lambda k, x: sample_tokens(k, x, config=config))(
        jax.random.key(0), jnp.asarray(z))
    np.testing.assert_array_equal(tokens, z.argmax(-1))
    np.testing.assert_allclose(logprob, np_log_softmax(z / config.logprob_temperature)[np.arange(16), z.argmax(-1)],
                               atol=1e-6)
    np.testing.assert_array_equal(sampled_logprob, 0.0)


def test_masked_tokens_are_never_drawn_even_when_tiny_or_last():
    # the only allowed tokens are at the two ends; the huge negative middle must never appear
    z = np.full((8,), -1e4, np.float32)
    z[0], z[-1] = 0.0, 0.0
    tokens, _, _ = _draw(SamplingConfig(max_new_tokens=1), logits=z, n=4000)
    assert set(np.unique(np.asarray(tokens)).tolist()) == {0, 7}
    # top_k=1 keeps the top token only, whatever the draw
    tokens, _, lq = _draw(SamplingConfig(max_new_tokens=1, top_k=1), n=1000)
    assert (np.asarray(tokens) == 0).all() and np.allclose(lq, 0.0)


def test_same_key_same_tokens_different_key_different_tokens():
    config = SamplingConfig(max_new_tokens=1)
    a, _, _ = _draw(config, n=256, seed=3)
    b, _, _ = _draw(config, n=256, seed=3)
    c, _, _ = _draw(config, n=256, seed=4)
    np.testing.assert_array_equal(a, b)
    assert (np.asarray(a) != np.asarray(c)).any()
