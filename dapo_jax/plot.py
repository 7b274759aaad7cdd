"""PNG curves of a run, in the spirit of the DAPO paper's figures (matplotlib, Agg backend).

    dapo-jax plot RUN_DIR            # writes RUN_DIR/plots/*.png and prints their paths

One figure per quantity the paper tracks: reward, training and held-out accuracy, entropy,
response length (mean and max), clip fractions (low / high), and the dynamic-sampling kept fraction.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

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
}


def plot_run(run_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Writes one PNG per figure that has data; returns their paths."""
    run_dir = Path(run_dir)
    if not (run_dir / "metrics.jsonl").exists():
        raise FileNotFoundError(f"{run_dir}/metrics.jsonl does not exist: not a run directory")
    rows = read_metrics(run_dir)
    out_dir = Path(out_dir) if out_dir is not None else run_dir / "plots"
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (title, ylabel, series) in FIGURES.items():
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
        ax.set_title(title)
        ax.set_xlabel("training step")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
        fig.tight_layout()
        path = out_dir / f"{name}.png"
        fig.savefig(path)
        plt.close(fig)
        written.append(path)
    return written
