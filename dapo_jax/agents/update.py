"""Episodes into the update's `Batch`: every objective of the registry trains on them through the mask.

    out = episode_batch(arrays, rewards, objective=cfg, group_size=G, correct=correct)
    state, metrics = train_step(state, out.batch)        # out.keep [P]: the groups dynamic sampling keeps

`B = P G` episodes (episode `p G + g` is response `g` of group `p`; the `G` episodes of a group share
their prompt ids, `episodes.run_episodes` checks it). The batch's `response_mask` is the loss mask
(the model's ids only) and its `context_mask` every real id, so the forward sees tool and template
ids as context, and the loss, its token count, the entropy and the KL count model ids only
(`train_step.batch_logprobs`).

Rewards, shaped before the advantages as in single-turn runs (`objectives/loss.shape_rewards`):

- DAPO's soft overlong punishment and overlong filtering read the episode's MODEL ids (its length
  is what the model wrote; tool answers it did not choose do not count against it), and an
  episode is "truncated" when the episode budget, the cache or `max_turns` ended it;
- outcome estimators (GRPO, DAPO, Dr. GRPO, RLOO, ...) read the shaped outcome `[P, G]` and give
  every model id of the episode its advantage;
- `advantage: grpo_process` reads the turn rewards as process supervision's steps, each ending at
  its turn's last model id, the shaped outcome added to the last turn: a model id's advantage is
  the sum of the group-normalised turn rewards of its own turn and every later one, turn k weighed
  γ^(k − j) from turn j with the objective's `process_discount` γ (`agent.discount`; 1 by default);
- dynamic sampling judges groups on `correct` (or the shaped reward) exactly as for single turns;
  `keep [P]` says which groups to train on (the caller draws more episodes for the rest).
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
import numpy as np

from dapo_jax.agents.batch import with_outcome
from dapo_jax.objectives.loss import compute_advantages, dynamic_sampling_keep, shape_rewards
from dapo_jax.objectives.process import StepRewards
from dapo_jax.training.update.train_step import Batch


class EpisodeBatch(NamedTuple):
    batch: Batch  # [P, G, ...]
    keep: np.ndarray  # [P] bool: the groups dynamic sampling keeps (all without it)
    rewards: jnp.ndarray  # [P, G] the shaped outcome rewards
    stats: dict[str, float]


def shape_episodes(arrays: dict, rewards: np.ndarray, *, objective, group_size: int):
    """`(shaped [P, G], loss_mask [P, G, T], target)` of `B = P G` episodes: the outcome `rewards [B]`
    shaped on the episodes' MODEL ids (overlong punishment and filtering), the loss mask after overlong
    filtering, and what the advantages read: the shaped outcome, or with step rewards (`grpo_process`)
    the turns as `StepRewards [P, G, J]` with the shaped outcome added to each episode's last turn.
    Shared by `episode_batch` and the run's episode source (training/episode_source.py)."""
    b = arrays["response_ids"].shape[0]
    if b % group_size:
        raise ValueError(f"{b} episodes do not split into groups of {group_size}")
    p, g = b // group_size, group_size
    grouped = lambda x: jnp.asarray(np.asarray(x).reshape(p, g, *np.shape(x)[1:]))
    shaped, loss_mask = shape_rewards(objective, grouped(rewards), grouped(arrays["model_tokens"]),
                                      grouped(arrays["truncated"]), grouped(arrays["loss_mask"]))
    if objective.needs_step_rewards:
        steps = with_outcome(arrays["step_rewards"], arrays["num_turns"], np.asarray(shaped).reshape(b))
        target = StepRewards(grouped(steps), grouped(arrays["step_ends"]), grouped(arrays["step_mask"]))
    else:
        target = shaped
    return shaped, loss_mask, target


def episode_batch(arrays: dict, rewards: np.ndarray, *, objective, group_size: int,
                  correct: np.ndarray | None = None) -> EpisodeBatch:
    """The update's batch from `agents.batch.episode_arrays` and the outcome `rewards [B]`
    (`correct [B]` for dynamic sampling on correctness)."""
    b = arrays["response_ids"].shape[0]
    shaped, loss_mask, target = shape_episodes(arrays, rewards, objective=objective, group_size=group_size)
    p, g = b // group_size, group_size
    grouped = lambda x: jnp.asarray(np.asarray(x).reshape(p, g, *np.shape(x)[1:]))
    adv = compute_advantages(objective, target, loss_mask)
    adv = jnp.broadcast_to(adv[..., None] if adv.ndim == 2 else adv, loss_mask.shape) * loss_mask
    keep = np.ones(p, bool)
    stats = {}
    if objective.dynamic_sampling:
        keep, counts = dynamic_sampling_keep(objective, correct=None if correct is None else grouped(correct),
                                             rewards=shaped)
        keep = np.asarray(keep)
        stats = {f"dynamic_sampling/{k}": float(v) for k, v in counts.items()}
    zeros = jnp.zeros(loss_mask.shape, jnp.float32)
    old_logp = grouped(arrays["logp"])
    batch = Batch(
        prompt_ids=jnp.asarray(arrays["prompt_ids"][::g]), prompt_mask=jnp.asarray(arrays["prompt_mask"][::g]),
        response_ids=grouped(arrays["response_ids"]), response_mask=loss_mask.astype(jnp.float32),
        old_logp=old_logp, advantages=adv, ref_logp=zeros,
        behaviour_logp=old_logp if objective.needs_behaviour_logp else None,
        context_mask=grouped(arrays["context_mask"]).astype(jnp.float32),
    )
    return EpisodeBatch(batch, keep, shaped, stats)
