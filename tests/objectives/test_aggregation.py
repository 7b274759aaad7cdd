"""(loss_sum, denominator) aggregation: NumPy references and micro-batch invariance (docs/objectives.md#aggregation)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives import aggregation as agg

MODES = ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "group_mean_token_mean", "constant_norm"]
T_MAX = 7


def batch(seed, P=4, G=3, T=T_MAX):
    rng = np.random.default_rng(seed)
    loss = rng.normal(size=(P, G, T)).astype(np.float32)
    lengths = rng.integers(0, T + 1, size=(P, G))
    lengths[0, 0] = 0  # an empty response
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    return loss, mask


def np_loss(mode, loss, mask):
    P, G, T = loss.shape
    tok_sum, tok_n, seq_means, seq_sums, n_resp = 0.0, 0.0, 0.0, 0.0, 0
    group_means, n_groups = 0.0, 0
    for p in range(P):
        g_sum = sum(float(loss[p, g, t]) for g in range(G) for t in range(T) if mask[p, g, t] > 0)
        g_n = float(mask[p].sum())
        if g_n > 0:
            group_means += g_sum / g_n
            n_groups += 1
        for g in range(G):
            L = mask[p, g].sum()
            s = sum(float(loss[p, g, t]) for t in range(T) if mask[p, g, t] > 0)
            tok_sum += s
            tok_n += L
            if L > 0:
                n_resp += 1
                seq_means += s / L
                seq_sums += s
    return {
        "token_mean": tok_sum / tok_n,
        "seq_mean_token_mean": seq_means / n_resp,
        "seq_mean_token_sum": seq_sums / n_resp,
        "group_mean_token_mean": group_means / n_groups,
        "constant_norm": tok_sum / (n_resp * T_MAX),
    }[mode]


@pytest.mark.parametrize("mode", MODES)
def test_matches_numpy(mode):
    for seed in range(3):
        loss, mask = batch(seed)
        s, d = getattr(agg, mode)(loss, mask, max_response_length=T_MAX)
        np.testing.assert_allclose(float(s) / float(d), np_loss(mode, loss, mask), rtol=1e-5)


def test_hand_case():
    loss = jnp.array([[[1.0, 3.0, 100.0], [2.0, 0.0, 0.0]]])
    mask = jnp.array([[[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]]])
    assert [float(x) for x in agg.token_mean(loss, mask)] == [6.0, 3.0]
    assert [float(x) for x in agg.seq_mean_token_mean(loss, mask)] == [4.0, 2.0]   # (2 + 2) over 2
    assert [float(x) for x in agg.seq_mean_token_sum(loss, mask)] == [6.0, 2.0]
    assert [float(x) for x in agg.constant_norm(loss, mask, max_response_length=3)] == [6.0, 6.0]
    assert [float(x) for x in agg.group_mean_token_mean(loss, mask)] == [2.0, 1.0]  # one group: 6 over 3 tokens


def test_group_mean_weighs_each_prompt_alike_where_token_mean_weighs_tokens():
    # prompt 0: two responses of 1 token, loss 1 each; prompt 1: one response of 4 tokens, loss 4 each
    loss = jnp.array([[[1.0, 0, 0, 0], [1.0, 0, 0, 0]], [[4.0, 4, 4, 4], [9.0, 9, 9, 9]]])
    mask = jnp.array([[[1.0, 0, 0, 0], [1.0, 0, 0, 0]], [[1.0, 1, 1, 1], [0.0, 0, 0, 0]]])
    s, d = agg.group_mean_token_mean(loss, mask)
    assert (float(s), float(d)) == (5.0, 2.0)  # (1 + 4) over 2 prompts: 2.5
    s, d = agg.token_mean(loss, mask)
    assert (float(s), float(d)) == (18.0, 6.0)  # 3.0: the long group weighs 4 tokens to 2


@pytest.mark.parametrize("mode", MODES)
def test_micro_batch_invariance_value_and_gradient(mode):
    loss, mask = batch(3, P=6)
    w = jnp.asarray(np.random.default_rng(0).normal(size=loss.shape).astype(np.float32))
    fn = getattr(agg, mode)

    def whole(w):
        s, d = fn(w * loss, mask, max_response_length=T_MAX)
        return s / d

    def split(w, k):
        pairs = [fn(w[i::k] * loss[i::k], mask[i::k], max_response_length=T_MAX) for i in range(k)]
        return sum(p[0] for p in pairs) / sum(p[1] for p in pairs)

    for k in (2, 3, 6):
        np.testing.assert_allclose(float(split(w, k)), float(whole(w)), rtol=1e-6)
        np.testing.assert_allclose(np.asarray(jax.grad(split)(w, k)), np.asarray(jax.grad(whole)(w)), rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("mode", MODES)
def test_all_masked_gives_zero_pair_and_nan_on_padding_does_not_leak(mode):
    loss = jnp.full((2, 2, 3), jnp.nan)
    s, d = getattr(agg, mode)(loss, jnp.zeros((2, 2, 3)), max_response_length=3)
    assert float(s) == 0.0 and float(d) == 0.0
    loss2, mask2 = batch(1)
    loss2 = np.where(mask2 > 0, loss2, np.inf).astype(np.float32)
    s2, d2 = getattr(agg, mode)(loss2, mask2, max_response_length=T_MAX)
    assert np.isfinite(float(s2)) and float(d2) > 0


def test_constant_norm_needs_t_max():
    with pytest.raises(ValueError, match="max_response_length"):
        agg.constant_norm(jnp.zeros((1, 1, 2)), jnp.ones((1, 1, 2)))


def test_bf16_loss():
    loss, mask = batch(5)
    s, d = agg.token_mean(jnp.asarray(loss, jnp.bfloat16), mask)
    assert s.dtype == jnp.float32
    np.testing.assert_allclose(float(s) / float(d), np_loss("token_mean", loss, mask), atol=1e-2)
