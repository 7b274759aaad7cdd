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

from typing import Callable

import numpy as np

from pathlib import Path

from dapo_jax.data.datasets import FORMATS, DataError, Problem, load_problems, to_problems
from dapo_jax.rewards.pipeline import RewardPipeline
from dapo_jax.training.config import BUILT_IN_TASKS, REPO_ROOT, resolve_path

__all__ = ["DataError", "load_source", "make_stream", "resume_stream", "source_path", "decode_responses", "make_scorer",
           "make_data"]


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
        from dapo_jax.data.cot import cot_rows
        from dapo_jax.data.synthetic import synthetic_rows

        make_rows = synthetic_rows if source.name == "synthetic" else cot_rows
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


def make_stream(source, tokenizer, *, max_prompt_length: int, seed: int, shuffle: bool = True, key: str = "data.train"):
    """A resumable `dapo_jax.data.PromptStream` whose batches are `[n, max_prompt_length]`; `key` names
    the source's config section in its saved identity and errors."""
    from dapo_jax.data.stream import PromptStream

    problems = load_source(source, seed=seed)
    path = source_path(source)
    identity = {"key": key, "name": source.name, "path": str(path) if path is not None else None}
    try:
        return PromptStream(problems, tokenizer, max_prompt_length=max_prompt_length, template=source.template,
                            seed=seed, shuffle=shuffle, buckets=(max_prompt_length,), source=identity)
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
    """A `RewardPipeline` whose row failures (`on_error: raise`) are `DataError`s naming the functions:
    the user's to fix (exit code 2)."""

    def score(self, responses, truths, *, prompts=None):
        try:
            return super().score(responses, truths, prompts=prompts)
        except RuntimeError as e:
            raise DataError(f"reward {[n for n, _, _ in self.functions]}: {e}") from e

    def step_scorer(self, tokenizer, **kwargs):
        inner = super().step_scorer(tokenizer, **kwargs)

        def score(*args):
            try:
                return inner(*args)
            except RuntimeError as e:
                raise DataError(f"step rewards: {e}") from e

        return score


def make_scorer(reward_cfg, objective, *, tokenizer=None, max_length: int | None = None):
    """A `rewards.pipeline.RewardPipeline`: `(responses, truths, prompts=None) -> (rewards [N] float32,
    correct [N] bool, answer keys [N])`, and `.score(...)` for every function's part.

    The reward is `Σ_k w_k r_k` over `reward.functions`: registry names of `dapo_jax.rewards`, each with
    right/wrong values from `reward.right/wrong` (default: the objective's reward_correct / reward_wrong),
    and learned reward models (`reward_model`, `process_reward_model` with a `path`: checked here, their
    weights loaded later by `.load(mesh)`). `correct` and the answer keys (for maj@k) are the first rule
    function's. `tokenizer`: the policy's (to strip its chat template off the prompts a reward model
    reads); `max_length`: the run's prompt + response tokens (a reward model's default row length).
    """
    from dapo_jax.rewards import make_reward
    from dapo_jax.rewards.reward_model import LEARNED_REWARDS, make_learned_reward

    right = reward_cfg.right if reward_cfg.right is not None else objective.reward_correct
    wrong = reward_cfg.wrong if reward_cfg.wrong is not None else objective.reward_wrong
    functions = []
    for i, f in enumerate(reward_cfg.functions):
        try:
            if f.name in LEARNED_REWARDS:
                fn = make_learned_reward(f.name, resolve_path(f.path), f.options, wrong=wrong, max_length=max_length)
            else:
                fn = make_reward(f.name, right=right, wrong=wrong, **f.options)
        except (KeyError, TypeError, ValueError, OSError) as e:
            raise DataError(f"reward.functions.{i} ({f.name!r}): {e}") from e
        functions.append((f.name, fn, f.weight))
    return RunScorer(functions, on_error=reward_cfg.on_error, policy_tokenizer=tokenizer)


def make_data(cfg, tokenizer, objective, *, sample: int = 8):
    """`(train_stream, eval_stream | None, scorer)`, all checked before any model loads; with a supervised
    objective the train stream's examples carry their responses (training/supervised.py).

    Every configured file is opened and every row parsed (`make_stream`), the reward functions are
    built and run once on the first `sample` problems of each source (each ground truth scored as a
    response to itself), so a bad row, field, file or reward option fails in seconds, naming it.
    """
    max_len = cfg.data.max_prompt_length
    if objective.supervised:  # (prompt, response) examples to fine-tune on (training/supervised.py)
        from dapo_jax.training.supervised import supervised_stream

        stream = supervised_stream(cfg, tokenizer)
    else:
        stream = make_stream(cfg.data.train, tokenizer, max_prompt_length=max_len, seed=cfg.data.seed)
    eval_stream = None
    if cfg.data.eval is not None:
        eval_stream = make_stream(cfg.data.eval, tokenizer, max_prompt_length=max_len, seed=cfg.data.seed,
                                  shuffle=False, key="data.eval")
    scorer = make_scorer(cfg.reward, objective, tokenizer=tokenizer,
                         max_length=max_len + cfg.rollout.max_new_tokens)
    # the rule functions on the sources' answers (make_scorer has checked each reward model's folder)
    strict = scorer.replace(on_error="raise", learned=False) if len(scorer.learned) < len(scorer.functions) else None
    for name, s in (("data.train", None if objective.supervised else stream), ("data.eval", eval_stream)):
        if s is None or strict is None:
            continue
        answers = [e.answer for e in s.examples[:sample]]
        try:
            strict(answers, answers)
        except DataError as e:
            raise DataError(f"{name}: the reward cannot score this source's answers: {e}") from e
    return stream, eval_stream, scorer
