"""Supervised fine-tuning's objective (objectives/supervised.py): the token-mean NLL of the masked tokens as
an additive (loss_sum, denominator) pair, checked against NumPy on hand-built batches."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.objectives.loss import objective_terms
from dapo_jax.objectives.registry import load_objective
from dapo_jax.objectives.supervised import sft_terms


def test_hand_computed_case():
    # two responses: log-probs ln(1/2), ln(1/4) (mask 1, 1) and ln(1/8) then a padding position (mask 0)
    logp = np.log(np.array([[[0.5, 0.25]], [[0.125, 0.9]]], np.float32))
    mask = np.array([[[1, 1]], [[1, 0]]], np.float32)
    loss_sum, den, metrics = sft_terms(None, logp=logp, mask=mask)
    assert float(den) == 3.0
    np.testing.assert_allclose(float(loss_sum), np.log(2) + np.log(4) + np.log(8), rtol=1e-6)  # = 6 ln 2
    value, count = metrics["nll"]
    np.testing.assert_allclose(float(value) / float(count), 2 * np.log(2), rtol=1e-6)


def test_matches_numpy_through_objective_terms_with_its_gradient():
    rng = np.random.default_rng(0)
    p, g, t = 3, 1, 6
    logp = (-rng.random((p, g, t)) * 4).astype(np.float32)
    lengths = np.array([6, 2, 0])  # an empty response: no tokens, no loss
    mask = (np.arange(t) < lengths[:, None, None]).astype(np.float32)
    cfg = load_objective("sft")
    zeros = np.zeros_like(logp)

    def loss(lp):
        s, d, _ = objective_terms(cfg, logp=lp, old_logp=zeros, advantages=zeros[..., 0], mask=mask)
        return s / d

    value, grad = jax.value_and_grad(loss)(jnp.asarray(logp))
    ref = -(logp * mask).sum() / mask.sum()
    np.testing.assert_allclose(float(value), ref, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(grad), -mask / mask.sum(), rtol=1e-6)  # d/dlogp: -m / Σm


def test_padding_never_leaks_even_nan():
    logp = np.array([[[-1.0, np.nan]]], np.float32)
    mask = np.array([[[1.0, 0.0]]], np.float32)
    loss_sum, den, _ = sft_terms(None, logp=logp, mask=mask)
    assert float(loss_sum) == 1.0 and float(den) == 1.0


def test_shapes_are_checked():
    with pytest.raises(ValueError, match=r"\[P, G, T\]"):
        sft_terms(None, logp=np.zeros((2, 3)), mask=np.zeros((2, 3)))
    with pytest.raises(ValueError, match="expected the mask's"):
        sft_terms(None, logp=np.zeros((1, 1, 2)), mask=np.zeros((1, 1, 3)))


@pytest.mark.parametrize("field", [{"kl_beta": 0.1}, {"dynamic_sampling": True}, {"overlong_buffer": 4},
                                   {"entropy_coef": 0.01}, {"advantage": "gae"}])
def test_sft_refuses_rl_terms(field):
    with pytest.raises(ValueError, match="kind='sft'"):
        ObjectiveConfig(kind="sft", **field)


def test_recipe_is_supervised():
    cfg = load_objective("sft")
    assert cfg.kind == "sft" and cfg.supervised and not cfg.needs_reference
    assert not load_objective("dapo").supervised
