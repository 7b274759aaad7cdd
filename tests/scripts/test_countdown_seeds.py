"""scripts/countdown_seeds.py's bookkeeping, without real training: finished runs are skipped, the table is
mean ± sample sd of the hand-made runs' held-out accuracy, and the figure is written."""

import json
import sys

from tests.conftest import load_script

seeds_script = load_script("countdown_seeds")
experiment = sys.modules["experiment"]


def fake_run(path, accuracies: dict[int, float], steps: int):
    path.mkdir(parents=True)
    rows = [{"step": s, "eval/accuracy": a} for s, a in accuracies.items()]
    path.joinpath("metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    path.joinpath(experiment.DONE_FILE).write_text(json.dumps({"steps": steps, "finished": True, "wall_s": [1.0]}))


def test_finished_runs_make_the_table_and_figure(tmp_path, capsys):
    runs = tmp_path / "runs"
    fake_run(runs / "seed0", {0: 0.10, 10: 0.30}, 10)
    fake_run(runs / "seed1", {0: 0.20, 10: 0.40}, 10)
    figure = tmp_path / "fig.png"
    assert seeds_script.main(["--seeds", "0", "1", "--steps", "10", "--runs", str(runs), "--figure", str(figure)]) == 0
    out = capsys.readouterr().out
    assert "seed 0: finished earlier, skipped" in out.replace("DAPO, ", "")
    # step 0: mean (0.1 + 0.2) / 2 = 0.15, sample sd |0.1 - 0.2| / sqrt(2) = 0.0707; step 10: 0.35 and 0.0707
    assert "| 0, 1 | 0.150 ± 0.071 | 0.350 ± 0.071 |" in out
    assert "seed 1: 0: 0.200, 10: 0.400" in out
    assert figure.stat().st_size > 10_000
