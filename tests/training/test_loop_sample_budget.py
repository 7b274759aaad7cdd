"""train.max_samples: a run stops after the first step whose generated responses reach the budget,
evaluates there, and a resume keeps the count (scripts/league.py compares objectives at an equal
budget of generated samples, whatever each one's samples per step)."""

import numpy as np

from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from dapo_jax.training.metrics import read_metrics

G = 4  # tests/training/conftest.py's tiny run: 8 prompts x G 4 per round, up to 2 rounds (dynamic sampling)


def generated(run_dir) -> tuple[list[int], np.ndarray]:
    rows = [r for r in read_metrics(run_dir) if "generated_groups" in r]
    return [r["step"] for r in rows], np.cumsum([r["generated_groups"] * G for r in rows])


def test_stops_at_the_budget_evaluates_there_and_resumes_with_the_count(tiny_model_dir, tmp_path, overrides_for):
    run_dir = tmp_path / "run"

    def run(budget):
        return train(load_config(None, overrides_for(tiny_model_dir, run_dir, **{
            "train.steps": 40, "train.max_samples": budget, "train.eval_every": 0, "train.checkpoint_every": 0})))

    final = run(100)
    steps, spent = generated(run_dir)
    assert spent[-1] >= 100 and (len(spent) == 1 or spent[-2] < 100)  # the step that passes it is the last
    assert final["step"] == steps[-1] == len(steps) < 40
    assert "eval/accuracy" in final and "eval/accuracy" in read_metrics(run_dir)[-1]  # evaluated at the stop

    first_stop = steps[-1]
    run(300)  # a larger budget resumes from that step with the count it had, not from 0
    steps, spent = generated(run_dir)
    assert steps == list(range(1, len(steps) + 1)) and len(steps) > first_stop
    assert spent[-1] >= 300 and spent[-2] < 300
