"""The sampling half of DAPO's Algorithm 1: generate G responses for each prompt, reward them, and keep
groups until the batch is full (dynamic sampling, docs/objectives.md#dynamic-sampling).

    actor = Actor(cfg, programs, policy=policy, stream=stream, ...)
    groups, stats, carry = actor.collect(step, params, carry)   # exactly train_batch groups, padding included

`collect` is the whole host side of a step's rollout; `rl_step` calls it through the `Prefetcher`, which
runs it on a background thread one step ahead with `rollout.overlap`. Everything an `Actor` holds is
fixed for the run: the params and the carried groups come in as arguments, so the same call gives the
same groups on either thread. Round `i` of step `k` samples with `fold_in(fold_in(key, k), i)`.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable

import jax
import numpy as np

from dapo_jax.objectives.loss import dynamic_sampling_keep, shape_rewards
from dapo_jax.parallel.host import to_global
from dapo_jax.training import sources
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.group_filter import selection_stats
from dapo_jax.training.rollout import Groups, StreamedRounds, collect_groups
from dapo_jax.training.source_metrics import source_stats, watch_rounds


@dataclasses.dataclass(frozen=True)
class Actor:
    """Rollouts of the policy: the sampler, the prompts, the reward functions, the filters."""

    cfg: RunConfig
    generate: Callable  # (sampler state, prompt_ids [P, S], prompt_mask, key) -> Rollout (programs.generate)
    continuous: Any  # sampling.continuous.ContinuousSampler (rollout.continuous), or None
    policy: Any  # training.update.lora.PolicyWeights
    stream: Any  # data.PromptStream of the training prompts
    share: Any  # parallel.process_data.ProcessShare: this process's rows of a generation batch
    tokenizer: Any
    scorer: Any  # rewards.pipeline.RewardPipeline
    step_scorer: Callable | None  # process supervision's step rewards (docs/objectives.md#process-supervision)
    group_filter: Any  # training.group_filter.GroupFilter (GFPO), or None
    log: Any  # training.rollout_log.RolloutLog: the text of the logged steps
    key: jax.Array  # the run's raw PRNG key
    difficulty: Any = None  # training.difficulty.DifficultyFilter (data.difficulty), or None
    source_names: tuple[str, ...] = ()  # a data mixture's sources (data.sources): source/NAME/* metrics

    def collect(self, step: int, params, carry: Groups | None) -> tuple[Groups, dict, Groups | None]:
        """Samples generation rounds of `gen_batch` prompts until `train_batch` groups are kept (with
        dynamic sampling: groups whose rewards differ), at most `max_gen_batches` rounds; returns the
        batch, the step's rollout statistics and the surplus to carry (`rollout.collect_groups`)."""
        r = self.cfg.rollout
        keep = self.keep if self.cfg.objective_config.dynamic_sampling else None
        rounds = self._rounds(step, params, carry, keep)
        sample, keep_seen, seen = watch_rounds(rounds, keep) if len(self.source_names) > 1 else (rounds, keep, [])
        with contextlib.closing(rounds) if self.continuous is not None else contextlib.nullcontext():
            groups, stats, carry = collect_groups(
                *self.log.watch(step, sample, keep_seen), train_batch=r.train_batch,
                max_gen_batches=None if self.continuous is not None else r.max_gen_batches,
                on_starvation=r.on_starvation, carry=carry, carry_surplus=r.carry_surplus)
        if self.continuous is not None:  # the tokens drawn for the groups the stop dropped
            stats["stream_dropped_tokens"] = float(rounds.dropped_tokens)
        if self.group_filter is not None:  # GFPO's gfpo/* metrics of the batch, on this rollout's window
            stats.update(selection_stats(groups, self.group_filter))
        stats.update(source_stats(seen, self.source_names))  # a mixture's source/NAME/* (training/source_metrics.py)
        if self.difficulty is not None:
            stats.update(self.difficulty.stats())
        return groups, stats, carry

    def keep(self, groups: Groups) -> np.ndarray:
        """Dynamic sampling's `[N]` keep mask: groups with a spread of correctness (or reward); with GFPO the
        spread that counts is the kept subset's (group_filter.py)."""
        k, _ = dynamic_sampling_keep(self.cfg.objective_config, correct=groups.correct, rewards=groups.rewards,
                                     valid=groups.selected)
        return np.asarray(k, bool)

    def sample_round(self, step: int, round_idx: int, params) -> Groups:
        """One generation batch: `gen_batch` prompts x G responses, scored."""
        prompts = self.share.prompts(self.stream, self.cfg.rollout.gen_batch)  # this process's rows; then gathered
        sampler = self.policy.sampler(params)
        out = self.generate(*self._generate_inputs(step, round_idx, sampler, prompts.input_ids, prompts.attention_mask))
        return self.score(prompts, self.share.local(out))

    def _generate_inputs(self, step: int, round_idx: int, sampler, ids, mask) -> tuple:
        return sampler, *self.share.to_global((ids, mask), self.cfg.rollout.gen_batch), self._key(step, round_idx)

    def _key(self, step: int, round_idx: int) -> jax.Array:
        return jax.random.fold_in(jax.random.fold_in(self.key, step), round_idx)

    def precompile(self, sampler, programs) -> None:
        """Compiles what the first round runs, as `sample_round` calls it (training/update/compile_ahead.py): the
        sampler as `programs.sampler_programs` declares it (training/update/programs.py; the widest prompt
        bucket), for `policy.sampler(params)` given by its shapes and layouts, and the reward shaping's and
        dynamic sampling's array operations on a round's shapes."""
        r, objective = self.cfg.rollout, self.cfg.objective_config
        if self.continuous is not None:  # its programs compile as the stream admits and decodes
            return
        lo, hi = self.share.rows(r.gen_batch)
        (rollout,) = programs.sampler_programs(
            sampler, self._key(1, 0), width=max(self.stream.buckets), evaluation=False,
            put=lambda ids: self.share.to_global(ids[lo:hi], r.gen_batch))  # this process's rows, gathered
        rollout.compile()
        pg, t = (hi - lo, r.G), r.max_new_tokens
        shape_rewards(objective, np.zeros(pg, np.float32), np.zeros(pg, np.int32), np.zeros(pg, bool),
                      np.zeros((*pg, t), np.int32))
        if objective.dynamic_sampling:
            n = (r.gen_batch, r.G)  # judged on the whole round, gathered
            dynamic_sampling_keep(objective, correct=np.zeros(n, bool), rewards=np.zeros(n, np.float32),
                                  valid=np.ones(n, bool))

    def score(self, prompts, out) -> Groups:
        """Decode, reward, overlong shaping and GFPO's selection of one batch of this process's rows; every
        process gets the whole batch back, in row order."""
        objective = self.cfg.objective_config
        p, g, t = out.response_ids.shape
        source = np.asarray([e.source for e in prompts.examples], np.int32)  # a data mixture's (data/mixture.py)
        texts = sources.decode_responses(self.tokenizer, out.response_ids.reshape(p * g, t),
                                         out.response_mask.reshape(p * g, t))
        scored = self.scorer.score(texts, [a for a in prompts.answers for _ in range(g)],  # rewards/pipeline.py
                                   prompts=[x for x in prompts.texts for _ in range(g)],
                                   rows=[x for x in prompts.rows for _ in range(g)],  # user rewards read the rows
                                   sources=np.repeat(source, g))  # a mixture's (training/mixture.py)
        steps = (self.step_scorer(out.response_ids, out.response_mask, prompts.texts, prompts.answers)
                 if self.step_scorer else {})
        shaped, mask = shape_rewards(objective, scored.rewards.reshape(p, g), out.lengths, out.truncated,
                                     out.response_mask)
        groups = self.share.gather(Groups(
            prompts.input_ids, prompts.attention_mask, out.response_ids, np.asarray(mask, np.float32), out.logprobs,
            np.asarray(shaped, np.float32), scored.correct.reshape(p, g), out.lengths, out.truncated,
            np.ones(p, bool), np.zeros(p, np.int32), entropy=out.entropy, reward_parts=scored.parts.reshape(p, g, -1),
            source=source, prompt_index=np.asarray(prompts.indices, np.int32), **steps), self.cfg.rollout.gen_batch)
        if self.group_filter is not None:
            groups.selected = self.group_filter.select(groups.rewards, groups.lengths)
        if self.difficulty is not None:  # one visit of each prompt (training/difficulty.py)
            self.difficulty.record(groups)
        return groups

    def _rounds(self, step: int, params, carry: Groups | None, keep):
        """`round index -> Groups`: generation batches, or with continuous batching the groups as they finish."""
        r = self.cfg.rollout
        if self.continuous is None:
            return lambda i: self.sample_round(step, i, params)
        need = r.train_batch - (len(carry) if carry is not None else 0) if r.continuous_cap else None
        return StreamedRounds(self.continuous, self.policy.sampler(params), self.stream,
                              jax.random.fold_in(self.key, step), max_prompts=r.max_gen_batches * r.gen_batch,
                              score=self.score, keep_fn=keep, need=need)

    def initial_batch(self, params, round_idx: int) -> tuple:
        """VAPO's value pre-training batch `round_idx` (training/update/critic.py): one round of the initial policy,
        as device arrays `(prompt_ids, prompt_mask, response_ids, response_mask, rewards, valid)`."""
        g = collect_groups(lambda j: self.sample_round(0, round_idx, params), None, train_batch=self.cfg.rollout.train_batch,
                           max_gen_batches=1, on_starvation="train_on_kept")[0]
        host = (g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask, g.rewards,
                np.broadcast_to(g.valid[:, None], g.rewards.shape))
        return to_global(host, self.share.sharding)  # rows over the mesh, as in training


__all__ = ["Actor"]
