"""training/update/accumulate.py: the accumulation core's sums against NumPy, and the policy's piece loss."""

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.training.update.accumulate import add_sums, policy_sums, scan_pieces, zero_sums


def test_scan_pieces_sums_the_gradients_losses_and_counts_of_its_pieces():
    rng = np.random.default_rng(0)
    w = rng.normal(size=3).astype(np.float32)
    x = rng.normal(size=(4, 5, 3)).astype(np.float32)  # 4 pieces of 5 rows
    y = rng.normal(size=(4, 5)).astype(np.float32)
    mask = (rng.uniform(size=(4, 5)) > 0.3).astype(np.float32)

    def loss_fn(params, piece):
        xs, ys, ms = piece
        r = (xs @ params["w"] - ys) * ms
        return jnp.sum(r ** 2), (jnp.sum(ms), {"r": (jnp.sum(r), jnp.sum(ms))}, {"n": jnp.sum(ms)})

    params = {"w": jnp.asarray(w)}
    (gsum, loss_sum, den, extra), metrics = scan_pieces(loss_fn, params, (x, y, mask), zero_sums(params, ("n",)))
    r = (x @ w - y) * mask  # NumPy: Σ_pieces Σ_rows m (x·w - y)^2 and its gradient 2 Σ m (x·w - y) x
    np.testing.assert_allclose(np.asarray(gsum["w"]), 2 * np.einsum("pr,prk->k", r * mask, x), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(float(loss_sum), (r ** 2).sum(), rtol=1e-5)
    assert float(den) == float(extra["n"]) == mask.sum()
    np.testing.assert_allclose(np.asarray(metrics["r"][0]), r.sum(-1), rtol=1e-5, atol=1e-6)  # stacked per piece


def test_zero_sums_and_add_sums():
    params = {"a": jnp.ones((2, 3), jnp.bfloat16), "b": jnp.ones(4)}
    zeros = zero_sums(params)
    assert zeros[0]["a"].dtype == jnp.bfloat16 and float(jnp.abs(zeros[0]["a"]).sum()) == 0.0
    assert sorted(zeros[3]) == ["entropy_sum", "tokens"] and zero_sums(params, ())[3] == {}
    grads = jax.tree.map(lambda x: 2 * x, params)
    out = add_sums(add_sums(zeros, grads, 1.5, 2.0, {"entropy_sum": 0.5, "tokens": 3.0}), grads, 1.0, 1.0,
                   {"entropy_sum": 0.25, "tokens": 1.0})
    assert float(out[0]["b"][0]) == 4.0 and float(out[1]) == 2.5 and float(out[2]) == 3.0
    assert float(out[3]["entropy_sum"]) == 0.75 and float(out[3]["tokens"]) == 4.0


def test_policy_sums_sees_the_pass_values_with_the_forwards_gradient():
    """The objective gets the no-gradient pass's entropy values; the gradient is the forward's; the extra
    sums count the loss mask only."""
    rng = np.random.default_rng(1)
    shape = (2, 3, 4)
    mask = jnp.asarray(rng.uniform(size=shape) > 0.4, jnp.float32)
    h_pass = jnp.asarray(rng.uniform(size=shape), jnp.float32)
    mb = SimpleNamespace(old_logp=jnp.zeros(shape), advantages=jnp.ones(shape), ref_logp=None, behaviour_logp=None)
    seen = {}

    def loss_terms(objective, *, logp, old_logp, advantages, mask, ref_logp, entropy, **extra):
        seen.update(extra)
        return jnp.sum(entropy * logp * mask), jnp.sum(mask), {}

    def loss(h):
        loss_sum, (den, _, extra) = policy_sums(loss_terms, None, mb, 2.0 * jnp.ones(shape), h, mask=mask,
                                                nll_weight=None, stats={"s": 1.0}, pass_values={"entropy": h_pass},
                                                use_ref=False)
        return loss_sum, (den, extra)

    h = jnp.asarray(rng.uniform(size=shape), jnp.float32)
    (loss_sum, (den, extra)), grad = jax.value_and_grad(loss, has_aux=True)(h)
    np.testing.assert_allclose(float(loss_sum), float(np.sum(2.0 * np.asarray(h_pass * mask))), rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), 2.0 * np.asarray(mask))  # d/dh of (h_pass + h - sg(h)) 2 m
    np.testing.assert_allclose(float(extra["entropy_sum"]), float(np.sum(np.asarray(h_pass * mask))), rtol=1e-6)
    assert float(extra["tokens"]) == float(den) == float(mask.sum()) and seen == {"s": 1.0}
