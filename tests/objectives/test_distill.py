"""On-policy distillation's advantages (objectives/distill.py) against NumPy: the per-token reverse KL, and
through the DAPO objective its gradient, which must equal the exact gradient of KL(π ‖ π_T)."""

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.objectives.distill import distill_advantages, reverse_kl_metric, reverse_kl_tokens
from dapo_jax.objectives.loss import objective_terms
from dapo_jax.objectives.registry import load_objective


def test_advantages_match_numpy():
    rng = np.random.default_rng(0)
    p, g, t = 3, 2, 5
    logp, teacher = (-rng.random((p, g, t)) * 3).astype(np.float32), (-rng.random((p, g, t)) * 3).astype(np.float32)
    mask = (np.arange(t) < rng.integers(0, t + 1, (p, g))[..., None]).astype(np.float32)
    task = rng.normal(size=(p, g)).astype(np.float32)
    out = distill_advantages(task, logp, teacher, mask, coef=0.5, task_weight=2.0)
    ref = (2.0 * task[..., None] - 0.5 * (logp - teacher)) * mask
    np.testing.assert_allclose(np.asarray(out), ref, rtol=1e-6, atol=1e-7)
    alone = distill_advantages(np.zeros((p, g)), logp, teacher, mask, coef=1.0, task_weight=0.0)
    np.testing.assert_allclose(np.asarray(alone), (teacher - logp) * mask, rtol=1e-6, atol=1e-7)
    value, count = reverse_kl_metric(logp, teacher, mask)
    np.testing.assert_allclose(float(value), ((logp - teacher) * mask).sum(), rtol=1e-5)
    assert float(count) == mask.sum()


def test_padding_never_leaks():
    logp = np.array([[[-1.0, np.nan]]], np.float32)
    teacher = np.array([[[-2.0, -np.inf]]], np.float32)
    out = distill_advantages(np.zeros((1, 1)), logp, teacher, np.array([[[1.0, 0.0]]]), coef=1.0, task_weight=1.0)
    np.testing.assert_array_equal(np.asarray(out), [[[-1.0, 0.0]]])


def numpy_reverse_kl_and_grad(z, teacher_logp):
    """KL(π ‖ π_T) with π = softmax(z), and its exact gradient dKL/dz_j = π_j (log π_j − log π_T,j − KL)."""
    logp = z - np.log(np.exp(z).sum())
    pi = np.exp(logp)
    kl = float((pi * (logp - teacher_logp)).sum())
    return kl, pi * (logp - teacher_logp - kl)


def test_the_update_descends_the_exact_reverse_kl():
    """One context, 4 tokens with π = (1/2, 1/4, 1/8, 1/8): a group of 8 one-token responses drawn in those
    proportions IS the expectation over π. With A_t = −(log π − log π_T) the DAPO loss's gradient at ratio 1
    must be the exact ∇KL(π ‖ π_T), and the mean per-token estimate the exact KL."""
    z = np.log(np.array([0.5, 0.25, 0.125, 0.125]))
    teacher_logp = np.log(np.array([0.1, 0.2, 0.3, 0.4]))
    tokens = np.array([0, 0, 0, 0, 1, 1, 2, 3])
    kl_ref, grad_ref = numpy_reverse_kl_and_grad(z, teacher_logp)

    mask = np.ones((1, 8, 1), np.float32)
    logp_tokens = (z - np.log(np.exp(z).sum()))[tokens].reshape(1, 8, 1).astype(np.float32)
    t_tokens = teacher_logp[tokens].reshape(1, 8, 1).astype(np.float32)
    adv = distill_advantages(np.zeros((1, 8)), logp_tokens, t_tokens, mask, coef=1.0, task_weight=0.0)
    np.testing.assert_allclose(float(np.mean(-np.asarray(adv))), kl_ref, rtol=1e-6)  # the estimate is exact here
    cfg = load_objective("dapo", overlong_buffer=None)

    def loss(logits):
        lp = jax.nn.log_softmax(logits)[tokens].reshape(1, 8, 1)
        s, d, _ = objective_terms(cfg, logp=lp, old_logp=jax.lax.stop_gradient(lp), advantages=adv, mask=mask)
        return s / d

    grad = jax.grad(loss)(jnp.asarray(z, jnp.float32))
    np.testing.assert_allclose(np.asarray(grad), grad_ref, rtol=1e-5, atol=1e-7)


def test_reverse_kl_tokens():
    np.testing.assert_allclose(np.asarray(reverse_kl_tokens(np.log([0.5]), np.log([0.25]))), [np.log(2)], rtol=1e-6)
