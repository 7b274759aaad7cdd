"""Rollout inspection: what the model wrote, how it was scored, and what the update did with it.

    log = RolloutLog(run_dir, every=50, sample=16, tokenizer=tok, enabled=jax.process_index() == 0)
    sample_fn, keep_fn = log.watch(step, sample_fn, keep_fn)   # records this step's generated groups
    groups, stats, carry = collect_groups(sample_fn, keep_fn, ...)
    log.write(step, groups, batch.advantages)                  # RUN_DIR/rollouts/STEP.jsonl

Metrics say a reward went up; only the text says whether the model learned the task or a hole in
the reward. Every `every` steps (and at the first step a process runs, so that the one small
compilation this costs happens before the metrics' compile count settles), the first `sample`
groups generated in the step are written, one JSON object per group:

    {"step": 50, "round": 0, "group": 3, "kept": true, "trained": true, "prompt": "...",
     "responses": [{"text": "...", "reward": 1.0, "correct": true, "advantage": 0.71, "length": 93,
                    "truncated": false, "entropy": 0.42}, ...]}

`kept` is dynamic sampling's verdict (always true without it); `trained` marks the kept groups that
made it into the update (the others were surplus); `advantage` is the one the update used (its
token mean over the response; null for groups not trained on and for overlong-filtered responses);
`reward` is the shaped reward (overlong penalty included). In an agent run each response also has
its `episode`: `{"turns": [{"role": "model", "text", "reward"}, {"role": "tool", "name", "text"}, ...],
"status", "outcome"}` (training/episode_source.py), and its `text` is every id after the prompt, tool
answers included. `dapo-jax show RUN_DIR [STEP]` prints it.
Every process takes part in gathering the advantages; only the one with `enabled` writes.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.parallel.host import to_host
from dapo_jax.training.rollout import Groups
from dapo_jax.training.sources import decode_responses


@jax.jit
def _per_response(advantages, mask):
    """[P, G, T] token advantages (already masked) -> [P, G] mean over each response's tokens."""
    return jnp.sum(advantages, axis=-1) / jnp.maximum(jnp.sum(mask, axis=-1), 1.0)


class RolloutLog:
    def __init__(self, run_dir: str | Path, *, every: int, sample: int, tokenizer, enabled: bool = True,
                 sources: tuple[str, ...] = ()):
        """`sources`: a data mixture's source names (data.sources): each group's line then names its own."""
        self.dir = Path(run_dir) / "rollouts"
        self.every, self.sample, self.tokenizer, self.enabled = every, sample, tokenizer, enabled
        self.sources = tuple(sources)
        self._first = True
        # step -> [Groups, keep mask or None] per generation round of that watched step (per step: with
        # rollout.overlap the next step's rollout is watched before this step is written)
        self._rounds: dict[int, list[list]] = {}
        self._episodes: dict[tuple[int, int], list[list[dict]]] = {}  # (step, round) -> [group][response]

    def active(self, step: int) -> bool:
        return self.every > 0 and (self._first or step % self.every == 0)

    def watch(self, step: int, sample_round, keep_fn):
        """`(sample_round, keep_fn)` for `collect_groups`, recording the rounds when `step` is logged."""
        if not self.active(step):
            return sample_round, keep_fn
        self._first = False
        rounds = self._rounds[step] = []

        def sample(i):
            groups = sample_round(i)
            if groups is not None:  # None: a continuous stream has no more (rollout.collect_groups)
                rounds.append([groups, None])
            return groups

        def keep(groups):
            mask = keep_fn(groups)
            rounds[-1][1] = np.asarray(mask, bool)
            return mask

        return sample, (keep if keep_fn is not None else None)

    def add_episodes(self, step: int, round_idx: int, episodes: list[dict], group_size: int) -> None:
        """An agent run's episodes of a round (`episode_source.episode_turns`, row `r G + g`), for a watched step."""
        if step in self._rounds:
            self._episodes[step, round_idx] = [episodes[i:i + group_size] for i in range(0, len(episodes), group_size)]

    def write(self, step: int, batch: Groups, advantages=None) -> Path | None:
        """Writes the watched step's sample; `advantages` = the trained batch's `[P, G, T]` (None: no update)."""
        rounds = self._rounds.pop(step, None)
        episodes = {r: self._episodes.pop((step, r)) for (k, r) in list(self._episodes) if k == step}
        if rounds is None:  # not watched: not a logged step
            return None
        adv = None
        if advantages is not None:
            adv = to_host(_per_response(advantages, jnp.asarray(batch.response_mask, jnp.float32)))
        if not self.enabled or not rounds:
            return None
        # Trained rows: carried groups first (age > 0), then this step's kept groups in round order.
        row = int(np.sum((batch.age > 0) & batch.valid))
        lines = []
        for r, (groups, keep) in enumerate(rounds):
            keep = np.ones(len(groups), bool) if keep is None else keep
            for i in range(len(groups)):
                trained_row = row if keep[i] and row < len(batch) and batch.valid[row] else None
                row += int(keep[i])
                if len(lines) < self.sample:
                    lines.append(self._group(step, r, i, groups, bool(keep[i]), trained_row, adv))
                    if r in episodes and i < len(episodes[r]):  # an agent run's: each response's turns
                        for response, episode in zip(lines[-1]["responses"], episodes[r][i]):
                            response["episode"] = episode
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / f"{step}.jsonl"
        tmp = path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(line) + "\n" for line in lines))
        os.replace(tmp, path)
        return path

    def _group(self, step, r, i, g: Groups, kept: bool, trained_row: int | None, adv) -> dict:
        prompt = self.tokenizer.decode(g.prompt_ids[i][g.prompt_mask[i].astype(bool)].tolist(),
                                       skip_special_tokens=True)
        texts = decode_responses(self.tokenizer, g.response_ids[i], _real_tokens(g, i))
        responses = []
        for j, text in enumerate(texts):
            n = int(g.lengths[i, j])
            a = None
            if adv is not None and trained_row is not None and g.response_mask[i, j].sum() > 0:
                a = float(adv[trained_row, j])
            responses.append({"text": text, "reward": float(g.rewards[i, j]), "correct": bool(g.correct[i, j]),
                              "advantage": a, "length": n, "truncated": bool(g.truncated[i, j]),
                              "entropy": float(g.entropy[i, j].sum() / max(n, 1))})
        source = {"source": self.sources[int(g.source[i])]} if self.sources else {}  # a mixture's
        return {"step": step, "round": r, "group": i, "kept": kept, "trained": trained_row is not None, **source,
                "prompt": prompt, "responses": responses}


def _real_tokens(g: Groups, i: int) -> np.ndarray:
    """`[G, T]` the generated tokens (overlong filtering zeroes the mask, not the tokens: show them anyway);
    an episode's every id after the prompt, tool answers included (its context mask)."""
    if g.context_mask.shape[-1]:
        return g.context_mask[i] > 0
    return np.arange(g.response_ids.shape[-1])[None, :] < g.lengths[i][:, None]


def rollout_steps(run_dir: str | Path) -> list[int]:
    d = Path(run_dir) / "rollouts"
    return sorted(int(p.stem) for p in d.glob("*.jsonl") if p.stem.isdigit()) if d.is_dir() else []


def read_rollouts(run_dir: str | Path, step: int | None = None) -> tuple[int, list[dict]]:
    """`(step, groups)` of RUN_DIR/rollouts/STEP.jsonl (None = the newest); FileNotFoundError says what exists."""
    steps = rollout_steps(run_dir)
    if not steps:
        raise FileNotFoundError(f"{Path(run_dir) / 'rollouts'}: no rollouts logged (train.rollouts_every=0, or the "
                                f"run has not reached a logged step)")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise FileNotFoundError(f"no rollouts for step {step} in {Path(run_dir) / 'rollouts'}; logged steps: {steps}")
    lines = (Path(run_dir) / "rollouts" / f"{step}.jsonl").read_text().splitlines()
    return step, [json.loads(line) for line in lines if line.strip()]
