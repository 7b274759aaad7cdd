"""`dapo-jax show RUN_DIR [STEP]`: the logged rollouts of a step (default the newest), readably.

    show_rollouts("runs/tiny_dapo")              # RUN_DIR/rollouts/NEWEST.jsonl
    show_rollouts("runs/tiny_dapo", 50, groups=4, width=0)

One table per group: its prompt, whether dynamic sampling kept it and the update trained on it,
then a row per response with its reward, correctness, advantage, length and text (cut to `width`
characters; 0 = whole). In an agent run each response's episode follows, turn by turn: the model's
text with the turn's reward, what the tools or the environment answered, and how it ended. The files are written by `dapo_jax.training.rollout_log` every
`train.rollouts_every` steps.
"""

from __future__ import annotations

import sys

from dapo_jax.tables import print_table
from dapo_jax.training.rollout_log import read_rollouts, rollout_steps


def _cut(text: str, width: int) -> str:
    text = text.replace("\r", "")
    return text if width <= 0 or len(text) <= width else text[:width] + f"… (+{len(text) - width} chars)"


def _num(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def show_rollouts(run_dir, step: int | None = None, *, groups: int | None = None, width: int = 300,
                  file=None, plain: bool | None = None) -> int:
    """Prints the groups of one logged step; returns the step shown."""
    file = file or sys.stdout
    step, rows = read_rollouts(run_dir, step)
    shown = rows[:groups] if groups else rows
    print(f"{run_dir}: step {step}, {len(shown)} of {len(rows)} logged groups (logged steps: "
          f"{rollout_steps(run_dir)})", file=file)
    for g in shown:
        verdict = ("kept, trained" if g["trained"] else "kept, not trained (surplus)") if g["kept"] else \
            "dropped by dynamic sampling"
        n_right = sum(r["correct"] for r in g["responses"])
        source = f" ({g['source']})" if "source" in g else ""  # a data mixture's source
        title = (f"\nround {g['round']} group {g['group']}{source}: {verdict}; {n_right}/{len(g['responses'])} "
                 f"correct\n"
                 f"prompt: {_cut(g['prompt'], width)}")
        table = [[str(j), _num(r["reward"], "+.3f"), "yes" if r["correct"] else "no", _num(r["advantage"], "+.3f"),
                  f"{r['length']}{' (cut)' if r['truncated'] else ''}", _cut(r["text"], width)]
                 for j, r in enumerate(g["responses"])]
        print_table(title, ["#", "reward", "correct", "advantage", "length", "response"], table, file=file,
                    plain=plain, wrap=[5])
        for j, r in enumerate(g["responses"]):  # an agent run's episodes, turn by turn
            if "episode" in r:
                print(format_episode(j, r["episode"], width), file=file)
    return step


def format_episode(index: int, episode: dict, width: int = 300) -> str:
    """One logged episode (rollout_log.py's `episode`), a line per turn: the model's text with the turn's
    reward, then each message the environment answered with, by role; then how it ended."""
    outcome = "none" if episode.get("outcome") is None else f"{episode['outcome']:g}"
    size = f", {episode['model_ids']} model ids of {episode['ids']}" if "ids" in episode else ""
    lines = [f"episode {index}: {episode['status']}, outcome reward {outcome}{size}"]
    turn = 0
    for t in episode["turns"]:
        if t["role"] == "model":
            turn += 1
            lines.append(f"  turn {turn} model (reward {t['reward']:g}): {_cut(t['text'], width)}")
        else:
            name = f" {t['name']}" if t.get("name") else ""
            lines.append(f"  turn {turn} {t['role']}{name}: {_cut(t['text'], width)}")
    return "\n".join(lines)
