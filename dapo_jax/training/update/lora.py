"""The policy's weights as the loop holds them: all trained (full fine-tuning), or LoRA adapters on a frozen base.

    policy, params = PolicyWeights.build(model, cfg.lora, seed=cfg.train.seed, mesh=mesh)
    state = init_train_state(params, tx)               # LoRA: the adapters only, so Adam holds moments of them only
    logprob_fn(policy.trainer(state.params), ...)      # LoRA: (frozen base, adapters), merged by nnx.merge
    train_step(state, batch, **policy.step_kwargs)     # LoRA: frozen=base; gradients w.r.t. the adapters alone
    generate(policy.sampler(state.params), ...)        # LoRA: a plain Decoder's state, W + (alpha/r)·A·B
    ref = policy.reference(params)                     # LoRA: (frozen base, zero adapters) = the base model

With `lora: None` every method is the identity of full fine-tuning (the reference is a copy of the
initial weights), so the loop has one code path.

Under LoRA (models/lora.py) the base weights exist once: the trainer merges them with the adapters
inside jit (`nnx.merge(graphdef, base, adapters)`), the reference policy is the same base with zero
adapters (x A·0 adds exactly 0: its log-probs are the base model's), checkpoints hold the adapters and
their optimizer state only.

The sampler runs on merged weights: `sampler(adapters)` adds (alpha/r)·A·B to each adapted kernel
(one jitted call; embeddings and norms are the base's own arrays) and the sampler, the same compiled
function as in full fine-tuning, decodes with no adapter matmuls. The cost is one extra copy of the
adapted projections while a rollout runs; it is freed before the update (nothing caches it), and it is
less than what LoRA saves (full fine-tuning's gradients and two Adam moments of every weight). Decoding
the unmerged model instead would save that copy at two extra rank-r matmuls per projection per token.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from dapo_jax.models.lora import add_lora, merge_weights, merged_kernels, plain_graphdef


@functools.partial(jax.jit, static_argnums=2)
def _merge(kernels, pairs, scaling):
    return merged_kernels(kernels, pairs, scaling)


@dataclasses.dataclass(frozen=True)
class PolicyWeights:
    """How the trainer, the sampler and the reference policy see the policy's weights."""

    graphdef: Any  # what the trainer merges (the model with its adapters under LoRA)
    sampler_graphdef: Any  # a plain Decoder's: the sampler's, evaluation's, the export's
    frozen: Any = None  # LoRA: every leaf but the adapters (the base weights), never updated
    scaling: float = 1.0  # LoRA: alpha / rank

    @classmethod
    def build(cls, model, lora=None, *, seed: int = 0, mesh=None) -> tuple["PolicyWeights", Any]:
        """`(policy, trained params)`. With a `lora` section (training/config/run.py's LoRASection), adapters
        are added to `model` IN PLACE (B = 0: it still computes the base model) and only they are returned."""
        if lora is None:
            graphdef, params = nnx.split(model)
            return cls(graphdef, graphdef), params
        add_lora(model, rank=lora.rank, alpha=lora.alpha, targets=tuple(lora.targets), rngs=nnx.Rngs(seed),
                 mesh=mesh)
        return cls.of_adapted(model, lora)

    @classmethod
    def of_adapted(cls, model, lora) -> tuple["PolicyWeights", Any]:
        """`(policy, adapters)` of a model that already carries its adapters (`dapo-jax plan` adds them to an
        abstract model, inside `nnx.eval_shape`, so that nothing is computed)."""
        graphdef, adapters, base = nnx.split(model, nnx.LoRAParam, ...)
        return cls(graphdef, plain_graphdef(model.config), base, lora.alpha / lora.rank), adapters

    @property
    def is_lora(self) -> bool:
        return self.frozen is not None

    def trainer(self, params):
        """What `train_step.policy_logprobs` merges with `graphdef`."""
        return params if self.frozen is None else (self.frozen, params)

    @property
    def step_kwargs(self) -> dict:
        """The train step's extra arguments (`make_train_step`'s `frozen`)."""
        return {} if self.frozen is None else {"frozen": self.frozen}

    def sampler(self, params):
        """The state `sampler_graphdef` merges with: `params`, or the base with the adapters merged in."""
        return params if self.frozen is None else merge_weights(self.frozen, params, self.scaling, merge_fn=_merge)

    def reference(self, params):
        """The reference policy's weights for `trainer`'s log-probs: a copy of the initial `params`, or
        under LoRA the base itself with zero adapters (no second copy of the base)."""
        if self.frozen is None:
            return jax.tree.map(jnp.copy, params)
        return self.frozen, jax.tree.map(jnp.zeros_like, params)

    def decoder(self, params):
        """A plain Decoder with the trained weights (merged under LoRA): evaluation and the HF export."""
        return nnx.merge(self.sampler_graphdef, self.sampler(params))
