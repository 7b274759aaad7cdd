"""What a step tells the user: its metrics row, the progress bar, and what to do when it trained on nothing.

    row = step_row(result, run, stream, scorer)      # one line of RUN_DIR/metrics.jsonl
    progress = Progress(cfg, run.step, enabled=main, run_dir=...)
    progress.update(result, run)                      # the bar; a warning for a step that kept nothing

A step whose dynamic sampling kept no group trains on nothing (`rl_step` skips the update) and warns. When
the run's first steps all keep nothing, the cause is rarely bad luck: the model is too weak for the task
(every response wrong) or the reward does not read what it writes (a format or answer-extraction
mismatch), and more rounds only burn time. The run says so once, with the step's accuracy, where to read
the responses and the knobs.
"""

from __future__ import annotations

import sys
import time
import warnings

from dapo_jax.data.datasets import DataError
from dapo_jax.training.metrics import compile_count
from dapo_jax.training.rollout import part_means
from dapo_jax.training.state.run_state import RunState
from dapo_jax.training.step import StepResult


def counters(run: RunState, stream) -> dict:
    """The run's totals, in every row and in the final summary."""
    rounds = {"data_round": run.data_round} if run.data_round else {}  # data.new_round (docs/mixtures.md)
    return {"steps_skipped": run.steps_skipped, "prompts_dropped_too_long": stream.num_skipped, **rounds}


def step_row(out: StepResult, run: RunState, stream, scorer) -> dict:
    """The metrics row of step `run.step`: the rollout's statistics, the update's metrics, throughput and time."""
    stats, m = out.stats, out.metrics
    failures = scorer.take_counts() if hasattr(scorer, "take_counts") else {}  # rewards that could not score
    return {**stats, **m, **counters(run, stream), **part_means(out.groups, scorer.part_names), **failures,
            "rollout_tokens_per_s": stats.get("rollout_tokens", 0.0) / max(stats["rollout_busy_s"], 1e-9),
            "update_tokens_per_s": float(m.get("update_tokens", 0.0)) / max(out.update_s, 1e-9),
            "rollout_time_s": out.rollout_s, "update_time_s": out.update_s, "step_time_s": out.rollout_s + out.update_s,
            "compilations": compile_count()}


def entropy_shown(out: StepResult) -> float:
    """The bar's entropy: the update's (the trained tokens'), else the generated responses' (nothing kept)."""
    return float(out.metrics.get("entropy", out.stats.get("entropy_generated", 0.0)))


def nothing_kept(step: int, stats: dict, cfg, run_dir) -> str:
    """Why a run's first steps keep nothing, and what to turn."""
    r = cfg.rollout
    acc = stats.get("accuracy", 0.0)
    if stats.get("all_wrong_fraction", 0.0) >= 1.0:
        seen = (f"every response was wrong (accuracy {acc:.2f}): the model is likely too weak for this task, or the "
                f"reward does not read its answers (a format or answer-extraction mismatch)")
    elif stats.get("all_correct_fraction", 0.0) >= 1.0:
        seen = f"every response was right (accuracy {acc:.2f}): the task is too easy for the model"
    else:
        seen = (f"no group's {cfg.objective_config.dynamic_sampling_metric} differed among its {r.G} responses "
                f"(accuracy {acc:.2f})")
    steps = "step 1" if step == 1 else f"steps 1-{step}"
    return (f"{steps} kept no group: in {int(stats.get('gen_rounds', 0))} generation round(s) per step "
            f"{seen}. Read the responses with `dapo-jax show {run_dir}`; then change model.path, the reward "
            f"(reward.functions) or the prompt (data.*.template), or give dynamic sampling more rounds "
            f"(rollout.max_gen_batches={r.max_gen_batches}) or another signal "
            f"(objective.dynamic_sampling_metric=reward, a reward with partial credit)")


def reward_unscored(row: dict) -> str:
    """The bar's `unscored=`: per function, the rows it failed on (`f`) and could not read the truth of
    (`u`), e.g. `gsm8k:u12 my_rewards:accuracy:f3,u1`; empty when every row was scored."""
    names = dict.fromkeys(k.split("/", 1)[1] for k in row if k.startswith(("reward_failures/", "reward_unreadable/")))
    shown = []
    for name in names:
        f, u = int(row.get(f"reward_failures/{name}") or 0), int(row.get(f"reward_unreadable/{name}") or 0)
        if f or u:
            shown.append(f"{name}:" + ",".join(f"{c}{n}" for c, n in (("f", f), ("u", u)) if n))
    return " ".join(shown)


class ReadsNothing:
    """Stops a run whose accuracy reward has read no answer in any response of its first `steps` steps (in
    this process), every one of which kept nothing: the responses are not in the form the reward reads, and
    more steps only burn time. A `DataError` naming the reward (exit 2)."""

    def __init__(self, run: RunState, scorer, run_dir, *, steps: int = 3):
        self.step0, self.skipped0 = run.step, run.steps_skipped
        self.scorer, self.run_dir, self.steps = scorer, run_dir, steps

    def check(self, run: RunState) -> None:
        n = run.step - self.step0
        if n < self.steps or run.steps_skipped - self.skipped0 < n or getattr(self.scorer, "answers_read", None) != 0:
            return
        j = self.scorer.accuracy
        raise DataError(f"reward.functions.{j} ({self.scorer.functions[j][0]!r}) has read no answer in any response of "
                        f"steps {self.step0 + 1}-{run.step}, and every one of them kept nothing: the responses are not "
                        f"in the form it reads. Read them with `dapo-jax show {self.run_dir}`, then change the prompt "
                        f"(data.train.template) or the reward (reward.functions)")


class Progress:
    """The progress bar (reward, accuracy, kept fraction, entropy) and the warnings of skipped steps.

    On a terminal the bar redraws itself in place; where `stream` is not a terminal (a log file, a
    scheduler's capture, `nohup`), a redrawn bar is a line only now and then, so each step writes one
    plain line instead: `[dapo-jax] step 12/400: reward 0.31, acc 0.25, kept 0.81, ent 0.56, 3.2 s`."""

    def __init__(self, cfg, initial: int, *, enabled: bool, run_dir, stream=None):
        from tqdm.auto import tqdm

        self.cfg, self.run_dir, self.explained = cfg, run_dir, False
        self.stream = stream if stream is not None else sys.stderr
        shown = bool(cfg.train.progress and enabled)
        self.lines = shown and not _is_terminal(self.stream)
        self.last = time.perf_counter()
        self.bar = tqdm(total=cfg.train.steps, initial=initial, disable=not shown or self.lines, desc="train",
                        file=self.stream)
        self.bar.set_postfix_str("the first step compiles its programs", refresh=True)  # until step 1's metrics

    def update(self, out: StepResult, run: RunState, row: dict | None = None) -> None:
        """`row`: the step's metrics row, for its reward failure counts."""
        stats = out.stats
        if out.skipped:
            warnings.warn(f"step {run.step}: dynamic sampling kept no group in {self.cfg.rollout.max_gen_batches} "
                          f"generation rounds; the update is skipped ({run.steps_skipped} skipped so far)",
                          RuntimeWarning, stacklevel=2)
            if run.steps_skipped == run.step and not self.explained:  # every step so far: say why, once
                self.explained = True
                warnings.warn(nothing_kept(run.step, stats, self.cfg, self.run_dir), RuntimeWarning, stacklevel=2)
        unscored = reward_unscored(row or {})
        by_source = {f"acc/{k.split('/')[1]}": f"{v:.2f}" for k, v in stats.items()
                     if k.startswith("source/") and k.endswith("/accuracy")}  # a data mixture's sources
        shown = dict(reward=f"{stats.get('reward_mean', 0):.2f}", acc=f"{stats.get('accuracy', 0):.2f}", **by_source,
                     kept=f"{stats.get('kept_fraction', 0):.2f}", ent=f"{entropy_shown(out):.2f}",
                     **({"unscored": unscored} if unscored else {}))
        if self.lines:
            now = time.perf_counter()
            seconds, self.last = now - self.last, now
            print(f"[dapo-jax] step {run.step}/{self.cfg.train.steps}: "
                  + ", ".join(f"{k} {v}" for k, v in shown.items()) + f", {seconds:.1f} s", file=self.stream, flush=True)
        self.bar.update(1)
        self.bar.set_postfix(**shown)

    def close(self) -> None:
        self.bar.close()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # closed, or no such method
        return False


__all__ = ["Progress", "ReadsNothing", "counters", "entropy_shown", "nothing_kept", "reward_unscored", "step_row"]
