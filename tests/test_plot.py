"""`plot_run` draws the DAPO-paper-style curves from metrics.jsonl (last line of a redone step wins)."""

import json

import matplotlib.image as mpimg
import pytest

from dapo_jax.plot import FIGURES, plot_run


def test_plot_writes_one_png_per_figure(tmp_path):
    rows = [{"step": 0, "eval/accuracy": 0.1}]
    for s in range(1, 6):
        rows.append({"step": s, "reward_mean": s / 10, "accuracy": s / 20, "entropy": 1.0 / s,
                     "response_length_mean": 3 + s, "response_length_max": 6, "clip_frac_low": 0.01,
                     "clip_frac_high": 0.02, "kept_fraction": 0.5, "all_correct_fraction": 0.2,
                     "all_wrong_fraction": 0.3})
    rows.append({"step": 5, "eval/accuracy": 0.4})
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"step\": 6, \"trunc")
    paths = plot_run(tmp_path)
    assert sorted(p.stem for p in paths) == sorted(FIGURES)
    for p in paths:
        img = mpimg.imread(p)
        assert img.ndim == 3 and img.shape[0] > 100 and img[..., :3].std() > 0  # not blank


def test_plot_skips_figures_without_data_and_rejects_non_runs(tmp_path):
    (tmp_path / "metrics.jsonl").write_text(json.dumps({"step": 1, "reward_mean": 0.5}) + "\n")
    assert [p.stem for p in plot_run(tmp_path, tmp_path / "out")] == ["reward"]
    with pytest.raises(FileNotFoundError, match="metrics.jsonl"):
        plot_run(tmp_path / "nope")
