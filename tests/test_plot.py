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
                     "all_wrong_fraction": 0.3, "response_length_right_mean": 3.0,
                     "response_length_wrong_mean": 3 + s})
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


def test_mean_band_averages_shared_x_and_interpolates_different_x():
    import numpy as np

    from dapo_jax.plot import mean_band

    x, mean, sd = mean_band([([0, 1, 2], [1.0, 2.0, 3.0]), ([0, 1, 2], [3.0, 2.0, 5.0])])
    np.testing.assert_array_equal(x, [0, 1, 2])
    np.testing.assert_allclose(mean, [2.0, 2.0, 4.0])
    np.testing.assert_allclose(sd, [np.sqrt(2), 0.0, np.sqrt(2)])  # sample sd (ddof 1)
    # different x: onto the common range [0, 10], linear interpolation of each run
    x, mean, sd = mean_band([([0, 10, 20], [0.0, 1.0, 2.0]), ([0, 5, 10], [0.0, 2.0, 4.0])], num=3)
    np.testing.assert_allclose(x, [0, 5, 10])
    np.testing.assert_allclose(mean, [0.0, (0.5 + 2.0) / 2, (1.0 + 4.0) / 2])
    _, _, sd1 = mean_band([([0, 1], [1.0, 2.0])])
    np.testing.assert_array_equal(sd1, [0.0, 0.0])


def test_plot_panels_draws_bands_and_skips_empty_figures(tmp_path):
    from dapo_jax.plot import Panel, plot_panels

    runs = [([0, 1, 2, 3], [0.1, 0.3, 0.4, 0.6]), ([0, 1, 2, 3], [0.2, 0.2, 0.5, 0.7])]
    path = plot_panels(tmp_path / "f.png", [Panel("acc", "step", "accuracy", {"a": runs, "b": runs[:1]}),
                                           Panel("empty", "step", "y", {"a": []})])
    img = mpimg.imread(path)
    assert img.shape[1] > img.shape[0] and img[..., :3].std() > 0
    assert plot_panels(tmp_path / "g.png", [Panel("empty", "s", "y", {"a": []})]) is None
    assert not (tmp_path / "g.png").exists()


def test_step_axes_tick_whole_steps_only():
    import matplotlib.pyplot as plt
    import numpy as np

    from dapo_jax.plot import label_axes

    fig, (steps, other) = plt.subplots(1, 2)
    for ax, integer_x in ((steps, True), (other, False)):
        ax.plot([1, 2], [0.3, 0.4], label="acc")  # a 2-step run: matplotlib would tick 1.0, 1.2, ..., 2.0
        label_axes(ax, "t", "training step", "y", integer_x=integer_x)
    fig.canvas.draw()
    lo, hi = steps.get_xlim()
    ticks = [t for t in steps.get_xticks() if lo <= t <= hi]
    assert ticks and np.array_equal(ticks, np.round(ticks))
    assert any(t != round(t) for t in other.get_xticks())  # the check can fail: the default ticks fractions
    plt.close(fig)


def test_a_mixture_gets_one_line_per_source_in_its_source_figures(tmp_path):
    from dapo_jax.plot import SOURCE_FIGURES, source_figures

    rows = [{"step": s, **{f"source/{n}/{k}": s / 10 for n in ("math", "code") for _, _, k in SOURCE_FIGURES.values()},
             "source/math/dropped": 1.0} for s in (1, 2, 3)]
    figures = source_figures(rows)
    assert set(figures) == set(SOURCE_FIGURES)
    assert figures["source_accuracy"][2] == [("source/math/accuracy", "math"), ("source/code/accuracy", "code")]
    assert source_figures([{"step": 1, "accuracy": 0.5, "difficulty/dropped": 2}]) == {}
    (tmp_path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert {p.stem for p in plot_run(tmp_path)} == set(SOURCE_FIGURES)


def test_a_chain_of_stages_is_marked_where_each_stage_begins():
    import matplotlib.pyplot as plt

    from dapo_jax.plot import mark_stages

    rows = [{"step": s + off, "stage": name, "stage_step": s, "reward_mean": 0.1}
            for name, off in (("sft", 0), ("dapo", 3), ("rft", 8)) for s in range(1, 4 if name == "sft" else 6)]
    fig, ax = plt.subplots()
    mark_stages(ax, rows)
    lines = [ln.get_xdata()[0] for ln in ax.get_lines()]
    assert lines == [3, 8] and [t.get_text() for t in ax.texts] == ["dapo", "rft"]  # the first stage: no line
    plt.close(fig)
    fig, ax = plt.subplots()
    mark_stages(ax, [{"step": 1, "reward_mean": 0.1}])  # a single run: nothing drawn
    assert not ax.get_lines() and not ax.texts
    plt.close(fig)
