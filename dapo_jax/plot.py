"""PNG curves of a run, in the spirit of the DAPO paper's figures (matplotlib, Agg backend).

    dapo-jax plot RUN_DIR            # writes RUN_DIR/plots/*.png and prints their paths

One figure per quantity the paper tracks: reward, training and held-out accuracy, entropy,
response length (mean and max), clip fractions (low / high), and the dynamic-sampling kept fraction;
the mean length of right and of wrong responses (Dr. GRPO's length inflation); and for a data
mixture, reward, accuracy, kept fraction and lengths with one line per source.

Several runs of one setting (seeds) are drawn as their mean with a ±1 sd band:

    plot_panels("out.png", [Panel("Entropy", "step", "nats", {"DAPO": [(x0, y0), (x1, y1)], ...})])
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from dapo_jax.training.metrics import read_metrics  # noqa: E402

# figure name -> (title, y label, [(metric key, legend label), ...])
FIGURES = {
    "reward": ("Reward", "mean reward", [("reward_mean", "reward (generated)")]),
    "accuracy": ("Accuracy", "accuracy", [("accuracy", "train (sampled)"), ("eval/accuracy", "held-out")]),
    "entropy": ("Generation entropy", "entropy (nats/token)", [("entropy", "entropy")]),
    "response_length": ("Response length", "tokens", [("response_length_mean", "mean"),
                                                      ("response_length_max", "max")]),
    "clip_fraction": ("Clipped tokens", "fraction", [("clip_frac_low", "low (A<0, ρ<1-ε_low)"),
                                                     ("clip_frac_high", "high (A>0, ρ>1+ε_high)")]),
    "kept_fraction": ("Dynamic sampling", "fraction of groups", [("kept_fraction", "kept"),
                                                                 ("all_correct_fraction", "all correct"),
                                                                 ("all_wrong_fraction", "all wrong")]),
    # Dr. GRPO's length-inflation signal (training/source_metrics.py): wrong responses growing longer than right ones
    "length_by_outcome": ("Response length by outcome", "tokens", [("response_length_right_mean", "right"),
                                                                   ("response_length_wrong_mean", "wrong")]),
}
# a data mixture's figures (docs/mixtures.md): one line per source, `source/NAME/KEY`
SOURCE_FIGURES = {
    "source_reward": ("Reward by source", "mean reward", "reward_mean"),
    "source_accuracy": ("Accuracy by source", "accuracy", "accuracy"),
    "source_kept_fraction": ("Kept by source", "fraction of groups", "kept_fraction"),
    "source_length_right": ("Length of right responses by source", "tokens", "response_length_right_mean"),
    "source_length_wrong": ("Length of wrong responses by source", "tokens", "response_length_wrong_mean"),
}


def source_figures(rows: list[dict]) -> dict:
    """`SOURCE_FIGURES` as `FIGURES` entries over the sources named in `rows` (none without a mixture)."""
    names = list(dict.fromkeys(k.split("/")[1] for r in rows for k in r if k.startswith("source/") and
                               k.count("/") == 2))
    if not names:
        return {}
    return {fig: (title, ylabel, [(f"source/{n}/{key}", n) for n in names])
            for fig, (title, ylabel, key) in SOURCE_FIGURES.items()}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Writes one PNG per figure that has data; returns their paths."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl does not exist: not a run directory")
    rows = read_metrics(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, ylabel, series) in {**FIGURES, **source_figures(rows)}.items():
        fig, ax = plt.subplots(figsize=(5, 3.2), dpi=110)
        drawn = False
        for key, label in series:
            points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
                drawn = True
        if not drawn:
            plt.close(fig)
            continue
        mark_stages(ax, rows)
        label_axes(ax, title, "training step", ylabel, legend_size=8)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written


def mark_stages(ax, rows: list[dict]) -> None:
    """A chain of stages' metrics (training/stages.py: rows with `stage`): a dotted line and the stage's name
    where each stage after the first begins."""
    starts: dict[str, int] = {}
    for r in rows:
        if "stage" in r and "stage_step" in r:
            starts.setdefault(r["stage"], r["step"] - r["stage_step"])
    for name, x in list(starts.items())[1:]:
        ax.axvline(x, color="grey", linestyle=":", linewidth=1)
        ax.annotate(name, (x, 1), xycoords=("data", "axes fraction"), fontsize=6, rotation=90, va="top", ha="right")


def label_axes(ax, title: str, xlabel: str, ylabel: str, *, integer_x: bool = True, legend_size: int = 7) -> None:
    """Title, labels, grid and legend; x ticks on whole numbers when x counts steps (a 2-step run
    would otherwise be ticked 0.25, 0.50, ...)."""
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if integer_x:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)


Curve = tuple  # (x [n], y [n]) of one run, x increasing


@dataclasses.dataclass
class Panel:
    """One axes of a comparison figure: for each label, the curves of its runs (seeds)."""

    title: str
    xlabel: str
    ylabel: str
    series: dict[str, list[Curve]]
    integer_x: bool = True  # x counts steps: whole-number ticks


def mean_band(curves: list[Curve], num: int = 60) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`(x, mean, sd)` over runs. Runs sharing their x are averaged point by point; otherwise each is
    interpolated onto `num` points spanning the x range they all cover. sd is 0 for a single run."""
    curves = [(np.asarray(x, float), np.asarray(y, float)) for x, y in curves if len(x)]
    if not curves:
        return np.zeros(0), np.zeros(0), np.zeros(0)
    x0 = curves[0][0]
    if all(len(x) == len(x0) and np.array_equal(x, x0) for x, _ in curves):
        x, ys = x0, np.stack([y for _, y in curves])
    else:
        lo, hi = max(x[0] for x, _ in curves), min(x[-1] for x, _ in curves)
        x = np.linspace(lo, hi, num) if hi > lo else np.array([lo])
        ys = np.stack([np.interp(x, cx, cy) for cx, cy in curves])
    sd = ys.std(axis=0, ddof=1) if len(ys) > 1 else np.zeros(len(x))
    return x, ys.mean(axis=0), sd


def plot_panels(path: str | Path, panels: list[Panel], *, suptitle: str | None = None,
                styles: dict[str, dict] | None = None) -> Path | None:
    """Side-by-side panels of mean curves with ±1 sd bands; None (nothing written) when no panel has data.

    `styles`: label -> `ax.plot` keywords (color, linestyle), so a series looks the same in every figure."""
    panels = [p for p in panels if any(c for c in p.series.values())]
    if not panels:
        return None
    fig, axes = plt.subplots(1, len(panels), figsize=(5 * len(panels), 3.4), dpi=110, squeeze=False)
    for ax, panel in zip(axes[0], panels):
        for label, curves in panel.series.items():
            x, mean, sd = mean_band(curves)
            if not len(x):
                continue
            style = {"marker": "o" if len(x) < 30 else None, "markersize": 3, **(styles or {}).get(label, {})}
            (line,) = ax.plot(x, mean, label=f"{label} (n={len(curves)})" if len(curves) > 1 else label, **style)
            if len(curves) > 1:
                ax.fill_between(x, mean - sd, mean + sd, color=line.get_color(), alpha=0.2, linewidth=0)
        label_axes(ax, panel.title, panel.xlabel, panel.ylabel, integer_x=panel.integer_x)
    if suptitle:
        fig.suptitle(suptitle, fontsize=10)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path
