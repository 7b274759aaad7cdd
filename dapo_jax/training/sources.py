"""The trainer's view of data and rewards, over `dapo_jax.data` and `dapo_jax.rewards`.

    stream = make_stream(cfg.data.train, tokenizer, max_prompt_length=64, seed=0)  # data.PromptStream
    batch = stream.next_batch(n)           # input_ids [n, max_prompt_length] (one fixed shape), answers
    scorer = make_scorer(cfg.reward, objective, tokenizer=tok)   # rewards.pipeline.RewardPipeline
    rewards, correct, keys = scorer(responses, truths, prompts=prompts)   # [N], [N], [N]; .score(): + parts

Prompts are always padded to exactly `max_prompt_length` (a single bucket), so the jitted sampler
and update compile once. The stream's `state_dict()` goes into every checkpoint, so a resumed run
consumes exactly the prompts an uninterrupted one would have; it carries the source's identity (config
key, name, resolved absolute path, a SHA-256 of its prompts), and `resume_stream` refuses a resume
on changed data (`data.stream.StreamMismatch`, exit 2) unless `data.accept_changed` says so (logged).
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Callable

import numpy as np

from dapo_jax.data.cot import cot_rows
from dapo_jax.data.countdown import countdown_rows
from dapo_jax.data.datasets import FORMATS, DataError, Problem, load_problems, to_problems
from dapo_jax.data.stream import PromptStream
from dapo_jax.data.synthetic import synthetic_rows
from dapo_jax.rewards import make_reward
from dapo_jax.rewards.custom import is_custom_name, make_custom_reward
from dapo_jax.rewards.custom import label as custom_label
from dapo_jax.rewards.pipeline import NonFiniteReward, RewardPipeline
from dapo_jax.rewards.reward_model import LEARNED_REWARDS, LearnedReward, make_learned_reward
from dapo_jax.training.config.paths import BUILT_IN_TASKS, REPO_ROOT, resolve_path

__all__ = ["DataError", "load_source", "make_stream", "resume_stream", "source_path", "decode_responses", "make_scorer"]


def source_path(source) -> Path | None:
    """The absolute path a configured source reads (a relative path resolved as `load_source` does, so
    from the working directory first); None for a built-in task or a hub name."""
    if source.name in BUILT_IN_TASKS:
        return None
    path = resolve_path(source.name)
    return path.resolve() if path.exists() else None


def load_source(source, *, seed: int = 0) -> list[Problem]:
    """The problems of one configured source (a built-in task: `synthetic` or `cot`, a file, a folder
    or a hub name)."""
    if source.name in BUILT_IN_TASKS:
        make_rows = {"synthetic": synthetic_rows, "cot": cot_rows, "countdown": countdown_rows}[source.name]
        split = "heldout" if source.split in ("test", "heldout") else source.split
        try:
            rows = make_rows(split, seed=seed, **source.options)
        except (TypeError, ValueError) as e:
            raise DataError(f"data source {source.name!r} (split={split!r}, options={source.options}): {e}") from e
        problems = to_problems(rows, "synthetic", source=source.name)
    else:
        if source.options:
            raise DataError(f"data source {source.name!r}: options={source.options} are settings of the built-in tasks "
                            f"{BUILT_IN_TASKS}, not of a file: remove them (override data.train.options={{}} or "
                            f"data.eval.options={{}})")
        path = resolve_path(source.name)
        looks_local = path.suffix in (".jsonl", ".json", ".parquet", ".csv") or source.name.startswith((".", "/"))
        if looks_local and not path.exists():
            raise DataError(f"data file {source.name}: no such file (looked in {Path.cwd()} and {REPO_ROOT}; a "
                            f"relative path in a config file is also looked up beside the file): download it (README, "
                            f"'Bring your own model and data') or point data.train.name / data.eval.name at it")
        try:
            problems = load_problems(path if path.exists() else source.name, format=source.format,
                                     split=source.split, problem_field=source.prompt_field,
                                     answer_field=source.answer_field)
        except DataError as e:
            if source.format != "synthetic":
                raise
            raise DataError(f"{e} (the format is 'synthetic', the built-in task's: set the file's own, e.g. "
                            f"data.train.format=gsm8k; known: {sorted(FORMATS)})") from e
    if source.limit:
        problems = problems[: source.limit]
    if not problems:
        raise DataError(f"data source {source.name!r} (split={source.split!r}) has no rows")
    return problems


def make_stream(source, tokenizer, *, max_prompt_length: int, seed: int, shuffle: bool = True, key: str = "data.train",
                order_seed: int | None = None):
    """A resumable `dapo_jax.data.PromptStream` whose batches are `[n, max_prompt_length]`; `key` names
    the source's config section in its saved identity and errors. `seed` draws a built-in task's problems,
    `order_seed` (default `seed`) the order they are visited in."""
    problems = load_source(source, seed=seed)
    path = source_path(source)
    identity = {"key": key, "name": source.name, "path": str(path) if path is not None else None}
    try:
        return PromptStream(problems, tokenizer, max_prompt_length=max_prompt_length, template=source.template,
                            seed=seed if order_seed is None else order_seed, shuffle=shuffle, buckets=(max_prompt_length,), source=identity)
    except ValueError as e:
        raise DataError(f"data source {source.name!r}: {e} (data.max_prompt_length={max_prompt_length})") from e


def resume_stream(stream, state: dict, cfg, say=print) -> None:
    """Puts the training stream at a checkpoint's position; raises `StreamMismatch` (one line, exit 2)
    when its prompts changed since the run started, unless `data.accept_changed` (then says what
    changed)."""
    changed = stream.load_state_dict(state, accept_changed=cfg.data.accept_changed)
    if changed:
        say(f"[dapo-jax] warning: resuming on changed data (data.accept_changed=true): {stream.source.get('key')}: "
            f"{'; '.join(changed)}", flush=True)


def decode_responses(tokenizer, response_ids: np.ndarray, response_mask: np.ndarray) -> list[str]:
    """`[N, T]` -> N strings of the real tokens, special tokens (EOS) dropped."""
    seqs = [row[m.astype(bool)].tolist() for row, m in zip(response_ids, response_mask)]
    return tokenizer.batch_decode(seqs, skip_special_tokens=True)


Scorer = Callable[[list[str], list[str]], tuple[np.ndarray, np.ndarray, list]]


class RunScorer(RewardPipeline):
    """A `RewardPipeline` whose faults are `DataError`s naming the function (the user's to fix, exit 2): a
    row failure under `on_error: raise`, a learned reward's non-finite score, and a function that has not
    scored one row since the run started (each row failed, or had a ground truth it cannot read).

    It counts, per function, the rows it failed on and those whose ground truth it cannot read;
    `take_counts()` gives `{reward_failures/NAME, reward_unreadable/NAME}` since its previous call (what a
    metrics row and the progress bar show)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lock = threading.Lock()
        self.require_scored = True  # False: a check on a few rows, not the run (make_data)
        # responses whose answer the accuracy function read (None: it has no answer extractor to ask)
        self.answers_read: int | None = 0 if hasattr(self.functions[self.accuracy][1], "answer_key") else None
        self._scored = dict.fromkeys(self.part_names, 0)
        self._counts: dict[str, int] = {}

    def score(self, responses, truths, *, prompts=None, rows=None, sources=None):
        """`sources`: each row's data source, for a mixture's scorer (training/mixture.py); one source here."""
        try:
            out = super().score(responses, truths, prompts=prompts, rows=rows)
        except NonFiniteReward as e:
            raise DataError(f"{e}") from e
        except RuntimeError as e:
            raise DataError(f"reward {[n for n, _, _ in self.functions]}: {e}") from e
        self._account(out, truths)
        return out

    def _account(self, out, truths) -> None:
        with self._lock:
            if self.answers_read is not None:
                self.answers_read += sum(k is not None for k in out.keys)
            for j, (name, fn, _) in enumerate(self.functions):
                part = self.part_names[j]
                self._scored[part] += out.scored[part]
                key = f"reward_failures/{part}"
                self._counts[key] = self._counts.get(key, 0) + out.failures[part]
                if part in out.unreadable:
                    key = f"reward_unreadable/{part}"
                    self._counts[key] = self._counts.get(key, 0) + out.unreadable[part]
                if self._scored[part] or not self.require_scored or not len(truths) or isinstance(fn, LearnedReward):
                    continue
                unread = [t for t in truths if not fn.truth_readable(t)] if part in out.unreadable else []
                raise DataError(
                    f"reward.functions.{j} ({name!r}) has not scored a single row since the run started: of the "
                    f"{len(truths)} rows just scored, {out.failures[part]} failed and {len(unread)} have a ground "
                    f"truth it cannot read" + (f" (e.g. {_short(unread[0])})" if unread else "")
                    + ": check that the reward fits the data (data.train.format, data.train.answer_field, "
                    "reward.functions)")

    def take_counts(self) -> dict[str, int]:
        """`reward_failures/NAME` (and `reward_unreadable/NAME` for functions that read a ground truth): rows
        counted since the previous call. The same keys every call, 0 where nothing was scored: with
        `rollout.overlap` the next rollout may or may not be scored before a step's row is written, and a
        resumed run's row must not differ from the uninterrupted one's in which keys it has."""
        with self._lock:
            counts = {f"reward_failures/{p}": 0 for p in self.part_names}
            counts.update({f"reward_unreadable/{self.part_names[j]}": 0 for j, (_, fn, _) in enumerate(self.functions)
                           if getattr(fn, "truth_readable", None) is not None})
            counts.update(self._counts)
            self._counts = {}
        return counts

    @property
    def for_eval(self) -> "RunScorer":
        """The scorer of held-out evaluation: this one (a mixture's is its run's `reward` section's)."""
        return self

    def step_scorer(self, tokenizer, **kwargs):
        inner = super().step_scorer(tokenizer, **kwargs)

        def score(*args):
            try:
                return inner(*args)
            except RuntimeError as e:
                raise DataError(f"step rewards: {e}") from e

        return score


def _short(value, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def make_scorer(reward_cfg, objective, *, tokenizer=None, max_length: int | None = None, key: str = "reward"):
    """A `rewards.pipeline.RewardPipeline`: `(responses, truths, prompts=None) -> (rewards [N] float32,
    correct [N] bool, answer keys [N])`, and `.score(...)` for every function's part.

    The reward is `Σ_k w_k r_k` over `reward.functions`: registry names of `dapo_jax.rewards`, each with
    right/wrong values from `reward.right/wrong` (default: the objective's reward_correct / reward_wrong),
    learned reward models (`reward_model`, `process_reward_model` with a `path`: checked here, their
    weights loaded later by `.load(mesh)`), and the user's own (`rewards/custom.py`: imported here, named
    in metrics by `custom.label`). `correct` and the answer keys (for maj@k) are the first rule function's.
    `tokenizer`: the policy's (to strip its chat template off the prompts a reward model reads, and the
    `cosine` reward's token counts); `max_length`: the run's prompt + response tokens (a reward model's
    default row length); `key`:
    the config section, for errors (a mixture source's: `data.sources.NAME.reward`).
    """
    right = reward_cfg.right if reward_cfg.right is not None else objective.reward_correct
    wrong = reward_cfg.wrong if reward_cfg.wrong is not None else objective.reward_wrong
    functions = []
    for i, f in enumerate(reward_cfg.functions):
        try:
            if f.name in LEARNED_REWARDS:
                fn = make_learned_reward(f.name, resolve_path(f.path), f.options, wrong=wrong, max_length=max_length)
            elif is_custom_name(f.name):  # the user's own: module:function, file.py:function, a URL
                fn = make_custom_reward(f.name, f.options, wrong=wrong)
            else:
                extra = {"tokenizer": tokenizer} if f.name == "cosine" and tokenizer is not None else {}
                fn = make_reward(f.name, right=right, wrong=wrong, **f.options, **extra)
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise DataError(f"{key}.functions.{i} ({f.name!r}): {e}") from e
        functions.append((custom_label(f.name) if is_custom_name(f.name) else f.name, fn, f.weight))
    return RunScorer(functions, on_error=reward_cfg.on_error, policy_tokenizer=tokenizer)
