"""Host side of a step: generate -> decode -> reward -> overlong shaping -> dynamic sampling.

    groups, stats, carry = collect_groups(sample_round, keep_fn, train_batch=P, max_gen_batches=10, ...)

`sample_round(i)` runs generation round `i` (a generation batch of prompts, G responses each) and
returns scored `Groups`. DAPO's dynamic sampling (docs/objectives.md#dynamic-sampling) keeps the groups whose
correctness (or reward) has non-zero spread, refilling with further rounds until `train_batch`
groups are kept; it trains on exactly `train_batch` of them. After `max_gen_batches` rounds it
either fails with a message or pads the batch with mask-0 groups (fixed shapes, no recompile).
Surplus kept groups can be carried to the next step (their `old_logp` is their own sampler's).

With continuous batching (`rollout.continuous`, `sampling/continuous.py`) a "round" is the next
`continuous_refill` groups to have finished decoding, in admission order (`StreamedRounds`): dynamic
sampling judges them as they arrive and stops the stream once `train_batch` are kept (without
dynamic sampling: once `train_batch` have arrived), so no round is decoded to its end for groups it
does not need; the groups still decoding then are dropped (the loop's `stream_dropped_tokens`). The
budget is the same number of prompts, `max_gen_batches * gen_batch`, and `gen_rounds` counts these
chunks.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np

from dapo_jax.data.stream import PromptBatch
from dapo_jax.training.source_metrics import length_by_outcome


class StarvationError(RuntimeError):
    """Dynamic sampling could not keep `train_batch` groups within `max_gen_batches` rounds."""


@dataclasses.dataclass
class Groups:
    """`N` prompt groups on the host (NumPy), the unit dynamic sampling keeps or drops."""

    prompt_ids: np.ndarray  # [N, S] int32 left-padded
    prompt_mask: np.ndarray  # [N, S] int32
    response_ids: np.ndarray  # [N, G, T] int32
    response_mask: np.ndarray  # [N, G, T] float32 (after overlong filtering)
    old_logp: np.ndarray  # [N, G, T] float32: the sampler's log-probs
    rewards: np.ndarray  # [N, G] float32: shaped total reward (correctness + overlong penalty)
    correct: np.ndarray  # [N, G] bool
    lengths: np.ndarray  # [N, G] int32
    truncated: np.ndarray  # [N, G] bool
    valid: np.ndarray  # [N] bool: False on padding groups (starvation)
    age: np.ndarray  # [N] int32: steps since sampled (carried groups are 1+)
    # [N, G, T] float32: the sampler's per-token entropy, 0 after the response's end (before overlong
    # filtering); None (e.g. a carry saved before this field existed) = zeros
    entropy: np.ndarray | None = None
    # [N, G] bool: the responses GFPO trains on (`training/group_filter.py`); None = all of them
    selected: np.ndarray | None = None
    # [N, G, J] process supervision's step rewards, their end-token indices and their slot mask
    # (`rewards/steps.py`); None = no steps (J = 0)
    step_rewards: np.ndarray | None = None
    step_ends: np.ndarray | None = None
    step_mask: np.ndarray | None = None
    # [N, G, K] each reward function's own reward, before its weight (`rewards/pipeline.py`): what
    # `multi_reward: normalize_then_sum` combines; None = no parts (K = 0)
    reward_parts: np.ndarray | None = None
    # [N] int32: each prompt's source in a data mixture (data/mixture.py; 0 without one) and [N] int32 its
    # index in that source: per-source metrics and difficulty filtering (training/difficulty.py); None = zeros
    source: np.ndarray | None = None
    prompt_index: np.ndarray | None = None

    def __post_init__(self):
        if self.entropy is None:
            self.entropy = np.zeros(self.old_logp.shape, np.float32)
        if self.selected is None:
            self.selected = np.ones(self.rewards.shape, bool)
        for name, dtype in (("step_rewards", np.float32), ("step_ends", np.int32), ("step_mask", np.float32),
                            ("reward_parts", np.float32)):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros((*self.rewards.shape, 0), dtype))
        for name, dtype in (("source", np.int32), ("prompt_index", np.int32)):
            if getattr(self, name) is None:
                setattr(self, name, np.zeros(self.rewards.shape[:1], dtype))

    def __len__(self) -> int:
        return int(self.prompt_ids.shape[0])

    def take(self, idx) -> "Groups":
        return Groups(**{f.name: getattr(self, f.name)[idx] for f in dataclasses.fields(self)})

    @staticmethod
    def concat(parts: list["Groups"]) -> "Groups":
        return Groups(**{f.name: np.concatenate([getattr(p, f.name) for p in parts])
                         for f in dataclasses.fields(Groups)})

    def padding(self, n: int) -> "Groups":
        """`n` mask-0 groups shaped like these (trained on as zeros: no loss, no gradient)."""
        def blank(x):
            return np.zeros((n, *x.shape[1:]), x.dtype)
        out = Groups(**{f.name: blank(getattr(self, f.name)) for f in dataclasses.fields(self)})
        out.prompt_mask[:, -1] = 1  # the logprob forward needs one real prompt token per row
        return out

    @staticmethod
    def blank(n: int, prompt_len: int, group_size: int, response_len: int, *, steps: int = 0,
              parts: int = 0) -> "Groups":
        """`n` valid all-zero groups with the dtypes a scored round has: what the programs a batch goes
        through are compiled for ahead of the first rollout (training/update/compile_ahead.py)."""
        p, g, t = n, group_size, response_len
        return Groups(np.zeros((p, prompt_len), np.int32), np.zeros((p, prompt_len), np.int32),
                      np.zeros((p, g, t), np.int32), np.zeros((p, g, t), np.float32), np.zeros((p, g, t), np.float32),
                      np.zeros((p, g), np.float32), np.zeros((p, g), bool), np.zeros((p, g), np.int32),
                      np.zeros((p, g), bool), np.ones(p, bool), np.zeros(p, np.int32),
                      step_rewards=np.zeros((p, g, steps), np.float32), step_ends=np.zeros((p, g, steps), np.int32),
                      step_mask=np.zeros((p, g, steps), np.float32), reward_parts=np.zeros((p, g, parts), np.float32))

    def state_dict(self) -> dict[str, np.ndarray]:
        # An empty optional field (no step rewards: J = 0) is left out: a checkpoint cannot hold a
        # zero-size array, and `from_state_dict` restores the default.
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if getattr(self, f.name).size or f.default is not None}

    @staticmethod
    def from_state_dict(d: dict) -> "Groups":
        return Groups(**{f.name: np.asarray(d[f.name]) for f in dataclasses.fields(Groups) if f.name in d})


def part_means(groups: Groups, names) -> dict[str, float]:
    """`reward/NAME`: each reward function's mean own reward (before its weight) over the batch's valid
    groups, when there are several functions (`Groups.reward_parts`)."""
    parts = groups.reward_parts
    if parts.shape[-1] < 2 or parts.shape[-1] != len(names) or not groups.valid.any():
        return {}
    kept = parts[groups.valid]
    return {f"reward/{name}": float(kept[..., k].mean()) for k, name in enumerate(names)}


def collect_groups(
    sample_round: Callable[[int], Groups | None],
    keep_fn: Callable[[Groups], np.ndarray] | None,
    *,
    train_batch: int,
    max_gen_batches: int | None,
    on_starvation: str = "fail",
    carry: Groups | None = None,
    carry_surplus: bool = False,
) -> tuple[Groups, dict, Groups | None]:
    """Runs generation rounds until `train_batch` groups are kept; returns (batch, stats, new carry).

    Args:
      sample_round: round index -> scored `Groups` of one generation batch, or None when there are
        no more (a `StreamedRounds` whose prompt budget is spent).
      keep_fn: groups -> `[N]` bool keep mask; None keeps everything (no dynamic sampling: one round,
        or a stream's rounds until `train_batch` groups).
      train_batch: groups per training batch; the result has exactly this many (padding included).
      max_gen_batches: the most rounds per step; None = until `sample_round` returns None.
      on_starvation: "fail" raises `StarvationError`; "train_on_kept" pads with `valid=False` groups.
      carry, carry_surplus: kept groups left over from the previous step, and whether to keep this
        step's surplus for the next one (else it is discarded, as verl does).

    Stats (fractions are over every group generated this step): `kept_fraction`,
    `all_correct_fraction`, `all_wrong_fraction`, `zero_adv_fraction`, `gen_rounds`, `carried_in`,
    `surplus`, and the generated responses' `reward_mean/std`, `accuracy`,
    `response_length_mean/std/max`, `response_length_right_mean/wrong_mean` (Dr. GRPO's length inflation:
    training/source_metrics.py), `truncated_fraction`, `entropy_generated` (see `_round_stats`).
    """
    kept: list[Groups] = []
    generated: list[Groups] = []
    n_kept = 0
    if carry is not None and len(carry):
        carry.age = carry.age + 1
        kept.append(carry)
        n_kept = len(carry)
    rounds = 0
    while n_kept < train_batch and (max_gen_batches is None or rounds < max_gen_batches):
        fresh = sample_round(rounds)
        if fresh is None:
            break
        rounds += 1
        generated.append(fresh)
        keep = np.ones(len(fresh), bool) if keep_fn is None else np.asarray(keep_fn(fresh), bool)
        if keep.shape != (len(fresh),):
            raise ValueError(f"keep mask must be [{len(fresh)}], got {keep.shape}")
        if keep.any():
            kept.append(fresh.take(np.flatnonzero(keep)))
            n_kept += int(keep.sum())
        if keep_fn is None and max_gen_batches is not None:  # one round; a stream's chunks fill the batch
            break
    all_gen = Groups.concat(generated) if generated else None
    stats = _round_stats(all_gen, n_kept - (len(carry) if carry is not None else 0), rounds)
    stats["carried_in"] = float(len(carry)) if carry is not None else 0.0
    if n_kept < train_batch:
        if on_starvation == "fail" or n_kept == 0 and all_gen is None:
            budget = (f"rollout.max_gen_batches={max_gen_batches}" if max_gen_batches is not None
                      else "continuous: rollout.max_gen_batches x gen_batch prompts")
            raise StarvationError(
                f"dynamic sampling kept {n_kept} of the {train_batch} groups needed after "
                f"{rounds} generation rounds ({budget}: every other group's "
                f"responses were all right or all wrong); raise rollout.max_gen_batches or rollout.gen_batch, "
                f"or set rollout.on_starvation=train_on_kept"
            )
        template = kept[0] if kept else all_gen
        kept.append(template.padding(train_batch - n_kept))
    pool = Groups.concat(kept)
    batch = pool.take(np.arange(train_batch))
    surplus = pool.take(np.arange(train_batch, len(pool))) if len(pool) > train_batch else None
    stats["surplus"] = float(len(surplus)) if surplus is not None else 0.0
    stats["trained_groups"] = float(batch.valid.sum())
    return batch, stats, (surplus if carry_surplus else None)


def _round_stats(g: Groups | None, n_kept_fresh: int, rounds: int) -> dict:
    """Stats of every group generated this step, kept or not (so runs with and without dynamic
    sampling compare on the same footing).

    `zero_adv_fraction`: groups whose shaped rewards are all equal, i.e. whose GRPO-style advantages
    are exactly 0 (without dynamic sampling, the part of the batch that gives no gradient; with the
    soft overlong penalty it can be below `all_correct_fraction + all_wrong_fraction`).
    `entropy_generated`: token mean of the sampler's entropy over all generated response tokens
    (those of overlong-filtered responses included).
    """
    if g is None:
        return {"gen_rounds": 0.0, "kept_fraction": 1.0}
    n = len(g)
    allc = g.correct.all(axis=1)
    allw = ~g.correct.any(axis=1)
    lengths = g.lengths.astype(np.float64)
    spread = g.rewards.max(axis=1) - g.rewards.min(axis=1)
    return {
        "gen_rounds": float(rounds),
        "generated_groups": float(n),
        "kept_fraction": n_kept_fresh / n,
        "all_correct_fraction": float(allc.mean()),
        "all_wrong_fraction": float(allw.mean()),
        "zero_adv_fraction": float((spread == 0).mean()),
        "reward_mean": float(g.rewards.mean()),
        "reward_std": float(g.rewards.std()),
        "accuracy": float(g.correct.mean()),
        "response_length_mean": float(lengths.mean()),
        "response_length_std": float(lengths.std()),
        "response_length_max": float(lengths.max()),
        **length_by_outcome(g.lengths, g.correct),  # Dr. GRPO's length-inflation signal
        "truncated_fraction": float(g.truncated.mean()),
        "rollout_tokens": float(lengths.sum()),
        "entropy_generated": float(g.entropy.sum(dtype=np.float64) / max(lengths.sum(), 1.0)),
    }


class StreamedRounds:
    """`sample_round` for `collect_groups` over a continuous-batching stream: round `i` is the `i`-th
    chunk of groups handed out, scored by `score(prompts, rollout) -> Groups` (`None` once the
    `max_prompts` prompts taken from `stream` are all decoded). `close()` drops the groups in flight.

    With `need` (the groups the step still needs kept), the stream admits only as many prompts as
    that need over the kept fraction seen so far (`keep_fn`, as dynamic sampling judges): a step
    that stops then drops fewer groups in flight. Which groups are kept does not change: it is
    still the first ones in admission order."""

    def __init__(self, sampler, params, stream, key, *, max_prompts: int, score: Callable,
                 need: int | None = None, keep_fn: Callable[[Groups], np.ndarray] | None = None):
        self._sampler = sampler
        kept = judged = 0  # this stream's groups kept by `keep_fn` (all without one), and handed out

        def next_prompts(n: int):
            batch = stream.next_batch(n)
            return batch.input_ids, batch.attention_mask, list(batch.examples)

        def scored(done):
            nonlocal kept, judged
            out = done.rollout
            groups = score(PromptBatch(out.prompt_ids, out.prompt_mask, tuple(done.payloads)), out)
            if need is not None:  # only the cap reads the counts (collect_groups judges again)
                kept += len(groups) if keep_fn is None else int(np.sum(keep_fn(groups)))
                judged += len(groups)
            return groups

        def in_flight() -> int:
            """Groups worth decoding beyond those handed out: the `need - kept` still missing over the
            fraction kept so far (1 before any, at least 1/10)."""
            rate = max(kept / judged, 0.1) if judged else 1.0
            return max(0, int(np.ceil((need - kept) / rate)))

        self._chunks = sampler.stream(params, next_prompts, key, max_prompts=max_prompts,
                                      in_flight=None if need is None else in_flight)
        self._rounds = map(scored, self._chunks)

    def __call__(self, i: int) -> Groups | None:
        return next(self._rounds, None)

    def close(self) -> None:
        self._chunks.close()

    @property
    def dropped_tokens(self) -> int:
        """After `close()`: tokens drawn for groups that were still decoding (or waiting for an earlier
        group) when the step stopped the stream: work it did not use."""
        return self._sampler.dropped_tokens
