"""Temperature / top-k / top-p / greedy token draws against NumPy references and known frequencies, and
the sort-free top-p / top-k filter against the sorted one it replaced (same kept set, same draws)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from dapo_jax.sampling import SamplingConfig, processors, sample_tokens, tempered_logprobs, truncation_mask


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


# --------------------------------------------------------------------------- sort-free vs sorted filter
# `truncation_mask` finds the nucleus among `_CANDIDATES` top tokens or by bisection, and wide top-k
# by bisection; `_truncation_mask_sorted` is the filter it replaced. Shrinking the widths sends small
# vocabularies down every path (candidates, bisection fallback, k-th value by bisection, blocks of rows).
WIDTHS = {"default": {}, "narrow": {"_CANDIDATES": 8, "_TOP_K_DIRECT": 16, "_BLOCK_ENTRIES": 1500}}
TOP_KS = (0, 1, 20, 50)
TOP_PS = (0.1, 0.7, 0.95, 1.0)


def logits_of(kind, rng, batch, vocab):
    if kind == "normal":
        return rng.normal(size=(batch, vocab)) * 3
    if kind == "flat":  # the nucleus holds most of the vocabulary
        return rng.normal(size=(batch, vocab)) * 0.3
    if kind == "peaked":  # a language model's shape: a few tokens far above an N(0, 2) tail
        z = rng.normal(size=(batch, vocab)) * 2
        for row in z:
            head = rng.choice(vocab, 8, replace=False)
            row[head] = 12 + 2 * rng.normal(size=8)
        return z
    if kind == "ties":  # seven levels: every boundary falls inside a group of equal logits
        return rng.integers(-3, 4, size=(batch, vocab)) * 0.5
    if kind == "tied_head":  # three equal top tokens, then distinct ones
        z = rng.normal(size=(batch, vocab))
        z[:, rng.choice(vocab, 3, replace=False)] = 4.0
        return z
    if kind == "masked":  # half the vocabulary at -inf (never kept, never drawn)
        z = rng.normal(size=(batch, vocab)) * 2
        z[:, rng.permutation(vocab)[: vocab // 2]] = -np.inf
        return z
    raise ValueError(kind)


KINDS = ("normal", "flat", "peaked", "ties", "tied_head", "masked")


def knife_edge_rows(logp, top_k, top_p, atol=1e-6):
    """Rows where float32 rounding may decide the boundary: for some value, the exact mass of the
    tokens above it lies within `atol` of `top_p` (the two filters sum the softmax denominator in
    different orders)."""
    if top_p >= 1.0:
        return []
    logp = np.asarray(logp, np.float64)
    rows = []
    for i, row in enumerate(logp.reshape(-1, logp.shape[-1])):
        values = np.sort(row)[::-1][: top_k or None]
        probs = np.exp(values - values[0])
        probs /= probs.sum()
        first_of_value = np.r_[True, values[1:] != values[:-1]]
        if np.any(np.abs((np.cumsum(probs) - probs)[first_of_value] - top_p) < atol):
            rows.append(i)
    return rows


@functools.cache
def sorted_filter(top_k, top_p):
    """The jitted reference, compiled once for all tests (it does not depend on the widths)."""
    return jax.jit(lambda lp: processors._truncation_mask_sorted(lp, top_k=top_k, top_p=top_p))


def assert_same_kept(got, want, logp, top_k, top_p, context=""):
    got, want = np.asarray(got), np.asarray(want)
    bad = np.nonzero((got != want).reshape(-1, got.shape[-1]).any(-1))[0].tolist()
    assert set(bad) <= set(knife_edge_rows(logp, top_k, top_p)), (
        f"{context}: rows {bad} keep different tokens: new {got.reshape(-1, got.shape[-1])[bad].sum(-1)}, "
        f"sorted {want.reshape(-1, want.shape[-1])[bad].sum(-1)}"
    )
    return len(bad)


@pytest.fixture(params=list(WIDTHS))
def widths(request, monkeypatch) -> str:
    """Each of WIDTHS's settings of the filters' widths, patched into `processors` for the test."""
    for name, value in WIDTHS[request.param].items():
        monkeypatch.setattr(processors, name, value)
    return request.param


def test_kept_set_and_filtered_logits_match_the_sorted_filter(widths):
    rng = np.random.default_rng(7)
    vocab, batch = 1000, 8
    cases = [
        (kind, tau, dtype, logits_of(kind, rng, batch, vocab))
        for kind in KINDS for tau in (0.6, 1.0, 1.5) for dtype in (jnp.float32, jnp.bfloat16)
    ]
    edges = rows = 0
    # narrow: only the settings that take a different path than under the default widths
    grid = [(k, p) for k in TOP_KS for p in TOP_PS if widths == "default" or (k in (0, 50) and p < 1) or k == 20]
    for top_k, top_p in grid:
        new = jax.jit(lambda lp: truncation_mask(lp, top_k=top_k, top_p=top_p))  # traced under these widths
        for kind, tau, dtype, z in cases:
            logp = tempered_logprobs(jnp.asarray(z, dtype), temperature=tau)
            got, want = new(logp), sorted_filter(top_k, top_p)(logp)
            edges += assert_same_kept(got, want, logp, top_k, top_p, f"{kind} tau {tau} {dtype.__name__} "
                                      f"top_k {top_k} top_p {top_p}")
            rows += batch
            np.testing.assert_array_equal(jnp.where(got, logp, -jnp.inf), jnp.where(want, logp, -jnp.inf))
            assert np.asarray(got)[np.arange(batch), np.asarray(logp).argmax(-1)].all()
    assert edges <= rows // 1000, f"{edges} of {rows} rows differ at a float32 knife edge"


def test_the_filters_take_every_path(widths):
    """The cases above reach the candidate list, the bisection fallback and (narrow) the k-th value by
    bisection: nuclei narrower and wider than the candidate list, top-k wider than `_TOP_K_DIRECT`."""
    rng = np.random.default_rng(7)
    kept = lambda kind, top_k, top_p: np.asarray(truncation_mask(
        tempered_logprobs(jnp.asarray(logits_of(kind, rng, 8, 1000)), temperature=1.0), top_k=top_k, top_p=top_p,
    )).sum(-1)
    assert (kept("peaked", 0, 0.95) < processors._CANDIDATES).all()  # the nucleus ends among the candidates
    assert (kept("flat", 0, 0.7) > processors._CANDIDATES).all()  # bisection over the vocabulary
    if widths == "narrow":
        assert 50 > processors._TOP_K_DIRECT
        assert (kept("flat", 50, 1.0) == 50).all() and (kept("flat", 50, 0.95) > processors._CANDIDATES).all()


def test_draws_are_identical_to_draws_with_the_sorted_filter(widths, monkeypatch):
    """Same uniforms, same kept set, so the same tokens and bit-identical log-probs."""
    rng = np.random.default_rng(11)
    vocab, batch = 1000, 64
    uniform = jax.random.uniform(jax.random.key(3), (batch,))
    settings = [(0, 0.7, 0.7, jnp.float32), (0, 0.95, 1.0, jnp.bfloat16), (20, 0.7, 1.0, jnp.float32),
                (50, 0.95, 1.3, jnp.bfloat16), (50, 1.0, 0.6, jnp.float32), (0, 0.1, 1.0, jnp.float32)]
    for top_k, top_p, tau, dtype in settings if widths == "default" else settings[1:4]:
        config = SamplingConfig(max_new_tokens=1, temperature=tau, top_k=top_k, top_p=top_p)
        new = jax.jit(lambda u, x: processors.draw_tokens(u, x, config=config))
        with monkeypatch.context() as patch:  # draw_tokens reads the filter when it is traced
            patch.setattr(processors, "truncation_mask", processors._truncation_mask_sorted)
            ref = jax.jit(lambda u, x: processors.draw_tokens(u, x, config=config))
            ref = ref.lower(uniform, jnp.zeros((batch, vocab), dtype)).compile()
        for kind in ("normal", "flat", "peaked", "ties"):
            logits = jnp.asarray(logits_of(kind, rng, batch, vocab), dtype)
            got, want = new(uniform, logits), ref(uniform, logits)
            edge = knife_edge_rows(tempered_logprobs(logits, temperature=tau), top_k, top_p)
            assert len(edge) <= 1
            same = np.setdiff1d(np.arange(batch), edge)
            for a, b in zip(got, want):
                np.testing.assert_array_equal(np.asarray(a)[same], np.asarray(b)[same], err_msg=f"{kind} {config}")
    # sample_tokens draws its uniforms from the key, then the same
    key = jax.random.key(5)
    np.testing.assert_array_equal(jax.jit(lambda k, x: sample_tokens(k, x, config=config))(key, logits)[0],
                                  new(jax.random.uniform(key, (batch,), jnp.float32), logits)[0])


@pytest.mark.parametrize("shape", [(1000,), (2, 3, 1000), (33, 300)])
def test_any_leading_shape_matches_the_sorted_filter(shape, monkeypatch):
    monkeypatch.setattr(processors, "_CANDIDATES", 8)  # bisection, in blocks of 1 and 3 rows
    monkeypatch.setattr(processors, "_BLOCK_ENTRIES", 1000)
    z = np.random.default_rng(2).normal(size=shape) * 2
    logp = tempered_logprobs(jnp.asarray(z), temperature=0.8)
    for top_k, top_p in [(0, 0.7), (50, 0.7)]:
        got = jax.jit(lambda x: truncation_mask(x, top_k=top_k, top_p=top_p))(logp)
        want = sorted_filter(top_k, top_p)(logp)
        assert got.shape == shape
        assert_same_kept(got, want, logp, top_k, top_p)


@pytest.mark.parametrize("widths", [{}, {"_CANDIDATES": 2, "_TOP_K_DIRECT": 3}])
def test_hand_computed_wide_vocabulary(widths, monkeypatch):
    """V = 5000 (> the candidate list): probabilities .4, .25, .15, .1 at scattered ids, then 4996 tail
    tokens sharing .1 equally (tied). Mass before them in order: 0, .4, .65, .8, then .9 for the tail."""
    for name, value in widths.items():
        monkeypatch.setattr(processors, name, value)
    vocab = 5000
    head = [4321, 17, 2500, 999]
    probs = np.full(vocab, 0.1 / (vocab - 4))
    probs[head] = [0.4, 0.25, 0.15, 0.1]
    logp = jnp.asarray(np.log(probs)[None], jnp.float32)

    settings = [dict(top_p=p) for p in (0.3, 0.5, 0.75, 0.85, 0.95)] + [
        dict(top_k=2, top_p=0.6), dict(top_k=2, top_p=0.7), dict(top_k=3), dict(top_k=10),
        dict(top_k=10, top_p=0.999), dict(top_k=10, top_p=0.9999)]
    masks = jax.jit(lambda x: [truncation_mask(x, **kw)[0] for kw in settings])(logp)  # one compilation
    by_setting = {tuple(sorted(kw.items())): np.asarray(m) for kw, m in zip(settings, masks)}

    def kept(**kw):
        mask = by_setting[tuple(sorted(kw.items()))]
        np.testing.assert_array_equal(mask, np.asarray(processors._truncation_mask_sorted(logp, **kw))[0])
        return sorted(np.nonzero(mask)[0].tolist()) if mask.sum() < 10 else int(mask.sum())

    assert kept(top_p=0.3) == [4321]
    assert kept(top_p=0.5) == [17, 4321]  # mass before id 17 is .4 < .5
    assert kept(top_p=0.75) == [17, 2500, 4321]  # mass before id 999 is .8 >= .75
    assert kept(top_p=0.85) == [17, 999, 2500, 4321]  # mass before the tail is .9 >= .85
    assert kept(top_p=0.95) == vocab  # the tail is kept, and it is all one tie
    assert kept(top_k=2, top_p=0.6) == [4321]  # renormalised .615, .385: mass before id 17 is .615
    assert kept(top_k=2, top_p=0.7) == [17, 4321]
    assert kept(top_k=3) == [17, 2500, 4321]
    # the 10th value is the tail's: ties at the k-th value are all kept
    assert kept(top_k=10) == vocab
    # over exactly 10 values (4 + 6 tail), the mass before the tail is .9 / (.9 + 6 * .1 / 4996) = .99987
    assert kept(top_k=10, top_p=0.999) == [17, 999, 2500, 4321]
    assert kept(top_k=10, top_p=0.9999) == vocab


def test_kth_largest_by_bisection_is_exact():
    rng = np.random.default_rng(4)
    z = np.round(rng.normal(size=(6, 777)) * 4, 1).astype(np.float32)  # many ties
    z[0, :700] = -np.inf
    z[1] = 0.0
    z[2, :5] = [np.float32(-0.0), 0.0, 1e-38, -1e-38, 3.4e38]
    for k in (1, 2, 50, 77, 776, 777):
        got = np.asarray(processors._kth_largest(jnp.asarray(z), k))[:, 0]
        np.testing.assert_array_equal(got, np.sort(z, axis=-1)[:, -k])


def test_no_recompilation_between_the_candidate_and_bisection_paths():
    config = SamplingConfig(max_new_tokens=1, temperature=1.0, top_p=0.7)
    draw = jax.jit(lambda u, x: processors.draw_tokens(u, x, config=config))
    rng = np.random.default_rng(0)
    uniform = jnp.full((4,), 0.5)
    for kind in ("peaked", "flat", "normal"):
        draw(uniform, jnp.asarray(logits_of(kind, rng, 4, 1000), jnp.float32))
    assert draw._cache_size() == 1


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="checks XLA:CPU's compiled program")
@pytest.mark.parametrize("top_k, top_p", [(0, 0.7), (20, 1.0), (50, 0.7), (8192, 0.7)])
def test_no_sort_of_the_vocabulary_is_compiled(top_k, top_p):
    """top_k is a partial sort only while all k values are read: XLA rewrites a top_k read at its last
    entry alone (the old top-k-only threshold) into a sort of the whole row."""
    logp = jax.ShapeDtypeStruct((8, 151936), jnp.float32)
    hlo = jax.jit(lambda x: truncation_mask(x, top_k=top_k, top_p=top_p)).lower(logp).compile().as_text()
    assert not [line for line in hlo.splitlines() if " sort(" in line and "151936" in line]
    old = jax.jit(lambda x: processors._truncation_mask_sorted(x, top_k=20)).lower(logp).compile().as_text()
    assert [line for line in old.splitlines() if " sort(" in line and "151936" in line]  # what it guards against
