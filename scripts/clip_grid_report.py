"""The page of `scripts/clip_grid.py`: tables, tests and figures from the grid's runs (kept or fresh).

    write(out, plan, rows, argv) -> the runs left out (unfinished)

Per run (`summaries`): ablate's outcome, dynamics and clip summaries, and the clipped tokens' share of the
output layer's per-token gradient norms (`clip_grad_share_high` / `_low`), each a mean over steps.
Comparisons (`comparisons`), one family under Holm's correction: clip-higher (ε_high 0.28 against 0.2) at each
ε_low; ε_low 0.1 and 0.3 against 0.2 at each ε_high; the random-reward arm against the same clip on the task's
reward; and, per row, the gradient share against the token share of the same runs (paired). The tests of rows
added later (`Row.follow_up`: the symmetric-clip random arm, and clip-higher on the random reward) are a second
family, corrected among themselves.
"""

from __future__ import annotations

import datetime
import os
from pathlib import Path

import numpy as np

import ablate
import significance
from experiment import FINDINGS_PLACEHOLDER, column, machine, markdown_table, rel, series, smooth, write_page

GRAD_COLUMNS = [  # (header, summary key, digits)
    ("clip high: tokens", "clip_high", 4), ("clip high: gradient", "grad_high", 4),
    ("clip low: tokens", "clip_low", 4), ("clip low: gradient", "grad_low", 4),
    ("A>0, π_old < 1/(1+ε_high)", "clip_high_possible", 4), ("A>0, ρ in [1.2, 1.28)", "ratio_pos_between", 4),
    ("upper-clipped: π_old < 0.2", "high_clip_p_old_lt02", 3), ("upper-clipped: mean π_old", "high_clip_p_old_mean", 3),
    ("lower-clipped: π_old < 0.2", "low_clip_p_old_lt02", 3), ("lower-clipped: mean π_old", "low_clip_p_old_mean", 3),
]
OUTCOME_COLUMNS = [("held-out acc. final", "final_acc", 3), ("best", "best_acc", 3), ("pass@k final", "final_pass", 3),
                   ("samples generated", "samples", 0), ("wall time (s)", "wall_s", 0)]
DYNAMICS_COLUMNS = [("H gen. end", "ent_gen_end", 3), ("H gen. min", "ent_gen_min", 3), ("H update end", "ent_upd_end", 3),
                    ("length mean", "len_mean", 2), ("length drift", "len_drift", 2), ("truncated", "trunc", 3),
                    ("zero-adv. groups", "zero_adv", 3), ("gen. rounds", "gen_rounds", 2)]
NAMES = {key: name for name, key, _ in OUTCOME_COLUMNS + DYNAMICS_COLUMNS + GRAD_COLUMNS}
TASK_METRICS = ("ent_gen_end", "ent_gen_min", "final_acc", "final_pass")  # what DAPO's Fig. 2 reads
RANDOM_METRICS = ("ent_gen_end", "ent_gen_min", "len_drift")  # the random arm's accuracy is its reward's noise


EPOCH_COLUMNS = [(f"pass {k}: {what}", f"e{k}_{key}", 4) for k in (1, 2)
                 for what, key in (("clip high, tokens", "high"), ("clip high, gradient", "grad_high"),
                                   ("clip low, tokens", "low"))]


# summary key -> the per-step metric it is the mean of: the gradient shares, and the first two passes' clip
# fractions with `optim.epochs` (step.epoch_metrics' `epochK/...`, EPOCH_COLUMNS)
GRAD_SERIES = {"grad_high": "clip_grad_share_high", "grad_low": "clip_grad_share_low",
               **{f"e{k}_{name}": f"epoch{k}/{metric}" for k in (1, 2) for name, metric in (
                   ("high", "clip_frac_high"), ("grad_high", "clip_grad_share_high"), ("low", "clip_frac_low"))}}


def grad_summary(run: dict) -> dict:
    """Means over steps of GRAD_SERIES' metrics (those a run does not log are left out)."""
    out = {}
    for name, key in GRAD_SERIES.items():
        _, y = series(run["rows"], key)
        if len(y):
            out[name] = float(y.mean())
    return out


def summaries(plan, rows) -> tuple[dict, dict, list[str]]:
    """Row key -> per-seed summaries, row key -> per-seed runs, and the runs not finished."""
    by_key, runs, _, missing = ablate.summarize_all(plan, rows, None)
    for key, summary in by_key.items():
        for s, run in zip(summary, runs[key]):
            s.update(grad_summary(run))
    return by_key, runs, missing


def pairs(rows) -> list[tuple[str, object, object, tuple[str, ...]]]:
    """(what, row a, row b, metrics): the grid's comparisons, a against b."""
    by = {(r.eps_low, r.eps_high, bool(r.extra)): r for r in rows}
    out = []
    lows = sorted({r.eps_low for r in rows if not r.extra})
    highs = sorted({r.eps_high for r in rows if not r.extra})
    for low in lows:
        for high in highs[1:]:
            if (low, high, False) in by and (low, highs[0], False) in by:
                out.append((f"ε_high {high} vs {highs[0]} at ε_low {low}", by[low, high, False], by[low, highs[0], False],
                            TASK_METRICS))
    mid = 0.2 if 0.2 in lows else lows[len(lows) // 2] if lows else None
    for high in highs:
        for low in lows:
            if low != mid and (low, high, False) in by and (mid, high, False) in by:
                out.append((f"ε_low {low} vs {mid} at ε_high {high}", by[low, high, False], by[mid, high, False],
                            TASK_METRICS))
    for r in rows:
        if r.extra and (r.eps_low, r.eps_high, False) in by:
            out.append(("random reward vs the task's", r, by[r.eps_low, r.eps_high, False], RANDOM_METRICS))
    randoms = sorted((r for r in rows if r.extra and r.eps_low == mid), key=lambda r: r.eps_high)
    for r in randoms[1:]:  # clip-higher on the random reward
        out.append((f"ε_high {r.eps_high} vs {randoms[0].eps_high}, random reward", r, randoms[0], RANDOM_METRICS))
    return out


def comparisons(rows, by_key: dict) -> str:
    """The comparison table (Welch, bootstrap interval, Holm over every test of the table)."""
    found = []
    for what, a, b, metrics in pairs(rows):
        for key in metrics:
            va = [v for v in column(by_key.get(a.key, []), key) if v is not None]
            vb = [v for v in column(by_key.get(b.key, []), key) if v is not None]
            if va and vb:
                found.append((what, a, b, key, va, vb, significance.compare(va, vb)))
    for r in rows:  # the gradient share against the token share, in the same runs
        for side in ("high", "low"):
            s = [x for x in by_key.get(r.key, []) if f"grad_{side}" in x and f"clip_{side}" in x]
            grad, tokens = [x[f"grad_{side}"] for x in s], [x[f"clip_{side}"] for x in s]
            if s:
                found.append((f"{side} clip: gradient vs token share", r, r, f"grad_{side}", grad, tokens,
                              significance.compare(grad, tokens, is_paired=True)))
    families = {False: [], True: []}  # a test is the follow-up family's when either of its rows is a follow-up
    for t in found:
        families[t[1].follow_up or t[2].follow_up].append(t)
    text = _family_table(families[False])
    if families[True]:
        text += ("\n\nThe follow-up family: the tests of the rows added after the first family was read ("
                 + ", ".join(f"`{r.key}`" for r in rows if r.follow_up)
                 + "), under Holm's correction among themselves.\n\n" + _family_table(families[True]))
    return text


def _family_table(found: list) -> str:
    """One family's table: `found` = (what, a, b, metric, a's values, b's values, comparison), Holm over them."""
    adjusted = significance.holm([c.p for *_, c in found])
    lines = ["| comparison | a → b | metric | a | b | Δ [95% interval] | p | Holm p | verdict |",
             "|---|---|---|---|---|---|---|---|---|"]
    for (what, a, b, key, va, vb, c), p_adj in zip(found, adjusted):
        pair = f"`{a.key}`" if a is b else f"`{a.key}` → `{b.key}`"
        name = NAMES.get(key, key) if a is not b else f"{NAMES[key]} − {NAMES['clip_' + key[5:]]} (paired)"
        lines.append(f"| {what} | {pair} | {name} | {np.mean(va):.4f} | {np.mean(vb):.4f} | "
                     f"{significance.tested_cells(c, p_adj, 4)} |")
    return "\n".join(lines) + "\n\n" + significance.legend(significance.family_size(adjusted))


def styles(rows) -> dict:
    """ε_low by colour, ε_high by line (0.2 dashed), the random arms grey (dotted; the symmetric one dash-dotted)."""
    lows = sorted({r.eps_low for r in rows})
    return {r.label: {"color": "0.5" if r.extra else f"C{lows.index(r.eps_low)}",
                      "linestyle": (":" if r.eps_high > r.eps_low else "-.") if r.extra else
                      ("--" if r.eps_high <= r.eps_low or r.eps_high == 0.2 else "-")}
            for r in rows}


def figures(out_dir: Path, rows, runs: dict, steps: int, prefix: str = "clip_grid", updates: int = 16) -> list[Path]:
    """DAPO's Fig. 2 (entropy of the generated responses, held-out accuracy) and the clip's token and gradient
    shares per step, every row; per-step metrics smoothed over 5% of the steps."""
    from dapo_jax.plot import Panel, plot_panels

    w = max(1, steps // 20)
    specs = {
        f"{prefix}_fig2": (f"Clip ranges, {updates} updates per rollout (DAPO Fig. 2)", [
            ("Entropy of all generated responses", "nats / token", "entropy_generated"),
            ("Held-out accuracy" + (" (random arms: their own reward)" if any(r.extra for r in rows) else ""), "avg@k",
             "eval/accuracy")]),
        f"{prefix}_shares": ("Where the clip binds: tokens and gradient", [
            ("Upper clip: share of update tokens", "fraction", "clip_frac_high"),
            ("Upper clip: share of the output layer's gradient", "fraction", "clip_grad_share_high"),
            ("Lower clip: share of the output layer's gradient", "fraction", "clip_grad_share_low")]),
    }
    written = []
    for name, (title, panel_specs) in specs.items():
        panels = []
        for ptitle, ylabel, metric in panel_specs:
            data = {}
            for row in rows:
                curves = [series(run["rows"], metric) for run in runs.get(row.key, [])]
                curves = [(x, y if metric.startswith("eval/") else smooth(y, w)) for x, y in curves if len(x)]
                if curves:
                    data[row.label] = curves
            panels.append(Panel(ptitle, "training step", ylabel, data))
        path = plot_panels(out_dir / f"{name}.png", panels, suptitle=title, styles=styles(rows))
        if path is not None:
            written.append(path)
    return written


def clip_histograms(runs: list[dict]) -> dict[str, np.ndarray]:
    """Per seed, the token counts of the whole run in each bin: {"high" / "low": [seeds, 10] (π_old of
    the upper- / lower-clipped tokens), "pos": [seeds, 7] (ρ of the A > 0 tokens)}."""
    out = {"high": [], "low": [], "pos": []}
    for run in runs:
        rows = [r for r in run["rows"] if "clip_high_p_old_0" in r and r.get("update_tokens")]
        if not rows:
            continue
        tokens = np.array([r["update_tokens"] for r in rows], float)[:, None]
        for name, prefix, n in (("high", "clip_high_p_old_", 10), ("low", "clip_low_p_old_", 10), ("pos", "ratio_pos_", 7)):
            out[name].append((np.array([[r[f"{prefix}{k}"] for k in range(n)] for r in rows]) * tokens).sum(0))
    return {k: np.array(v) for k, v in out.items() if v}


def write_fig3(path: Path, rows: list, runs: dict[str, list[dict]]) -> Path | None:
    """DAPO's Figure 3 in miniature: the π_old of the tokens clipped at the upper bound and at the lower
    bound (share of that side's clipped tokens per 0.1 bin; bars: all seeds pooled, whiskers: sd over
    seeds), and the ratio distribution of the A > 0 tokens (fraction of update tokens, log scale)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from dapo_jax.objectives.diagnostics import RATIO_EDGES

    hists = {row.key: clip_histograms(runs.get(row.key, [])) for row in rows}
    if not any(h.get("high") is not None for h in hists.values()):
        return None
    styles_ = styles(rows)
    fig, axes = plt.subplots(1, 3, figsize=(15, 3.6), dpi=110)
    width = 0.8 / max(1, len(rows))
    for i, row in enumerate(rows):
        h = hists[row.key]
        color = styles_[row.label]["color"]
        for ax, side in zip(axes[:2], ("high", "low")):
            if side not in h or h[side].sum() == 0:
                continue
            pooled = h[side].sum(0) / h[side].sum()
            per_seed = h[side] / np.maximum(h[side].sum(1, keepdims=True), 1e-12)
            err = per_seed.std(0, ddof=1) if len(per_seed) > 1 else None
            x = np.arange(10) * 0.1 + 0.05 + (i - (len(rows) - 1) / 2) * width * 0.1
            ax.bar(x, pooled, width=width * 0.1, color=color, yerr=err, capsize=2,
                   label=f"{row.label} ({int(h[side].sum()):,} tokens)")
        if "pos" in h:
            total = h["pos"].sum()  # A > 0 tokens; as a fraction of them
            x = np.arange(len(RATIO_EDGES) + 1) + (i - (len(rows) - 1) / 2) * width
            axes[2].bar(x, h["pos"].sum(0) / max(total, 1e-12), width=width, color=color, label=row.label)
    for ax, title in zip(axes[:2], ("Clipped at the upper bound (A>0, ρ>1+ε_high)",
                                    "Clipped at the lower bound (A<0, ρ<1−ε_low)")):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("π_old of the clipped token")
        ax.set_ylabel("share of that side's clipped tokens")
        ax.set_xticks(np.arange(0, 1.01, 0.2))
        ax.legend(fontsize=7)
        ax.grid(alpha=0.3)
    edges = ["<0.8", *[f"[{a},{b})" for a, b in zip(RATIO_EDGES, RATIO_EDGES[1:])], f"≥{RATIO_EDGES[-1]}"]
    axes[2].set_xticks(np.arange(len(edges)), edges, fontsize=7)
    axes[2].set_yscale("log")
    axes[2].set_title("Ratio ρ = π_θ/π_old of the A>0 tokens", fontsize=9)
    axes[2].set_ylabel("share of A>0 update tokens")
    axes[2].legend(fontsize=7)
    axes[2].grid(alpha=0.3)
    fig.suptitle("Which tokens the clip stops (DAPO Fig. 3): all steps, all seeds", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path


def write(out: Path, plan, rows, argv: list[str]) -> list[str]:
    by_key, runs, missing = summaries(plan, rows)
    epochs = int(next((o.split("=", 1)[1] for o in plan.common if o.startswith("optim.epochs=")), 1))
    epoch_table = "" if epochs == 1 else ("\nThe first and the second pass over each batch (means over steps of "
                                          "`epoch1/...`, `epoch2/...`):\n\n" +
                                          markdown_table(rows, by_key, EPOCH_COLUMNS) + "\n")
    figs = figures(out.parent / "figures", rows, runs, plan.steps, out.stem, 16 * epochs)  # named after the page
    fig3 = write_fig3(out.parent / "figures" / f"{out.stem}_fig3.png", rows, runs)
    figs += [fig3] if fig3 is not None else []
    fig_lines = "\n".join(f"![{p.stem}]({os.path.relpath(p, out.parent)})" for p in figs)
    row_lines = "\n".join(f"| {r.label} | `{r.key}` | {r.eps_low} | {r.eps_high} | "
                          f"{'`scripts/random_reward.py`' if r.extra else 'the task (`cot`)'} |" for r in rows)
    passes = "" if epochs == 1 else f", and {epochs} passes over each batch (`optim.epochs`: {16 * epochs} steps in all)"
    text = f"""# Clip-higher where the clip binds{"" if epochs == 1 else f", {epochs} epochs per rollout"}

Generated by `scripts/clip_grid.py`; the tables and figures are rewritten by every run of it.

DAPO's recipe (soft overlong punishment, token-level loss, dynamic sampling, KL 0) with each rollout batch split
into 16 optimizer steps, as DAPO's 512 prompts in mini-batches of 32{passes}, so the later mini-batches are
trained by a policy that has moved from the π_old that sampled them. The rows differ in the clip range alone{
"; the random arms train on a reward with no signal" if any(r.extra for r in rows) else ""}. Besides the share of the update's tokens the clip stops (`clip_frac_*`),
every run logs their share of the gradient (`objective.clip_grad_share`): each token's output-layer gradient
norm `|A|·ρ·‖h‖·‖e_y − p‖/τ` as the unclipped surrogate would give it, summed over the clipped tokens and
divided by the sum over all tokens.

- Command: `python scripts/clip_grid.py {" ".join(argv)}`
- Config: `{rel(plan.config)}`, {plan.steps} steps, evaluation every {plan.eval_every} steps, {len(plan.seeds)} seeds
  ({", ".join(map(str, plan.seeds))}: `train.seed` and `data.order_seed`), runs in `{rel(plan.runs_dir)}/ROW/seedS`
- Shared overrides (every row): {", ".join(f"`{o}`" for o in plan.common)}, and each row's
  `objective.eps_low` / `objective.eps_high`, `objective.clip_grad_share=true`
- Machine: {machine()}
- Date: {datetime.date.today().isoformat()}
{"- Unfinished or failed runs, left out of the tables: " + ", ".join(missing) if missing else ""}

| row | run folder | ε_low | ε_high | reward |
|---|---|---|---|---|
{row_lines}

## Results

Mean ± sd over seeds. Held-out accuracy is avg@k at the final evaluation (best: the best one); the random arm's
is scored by its own reward, so it is noise by construction.

{markdown_table(rows, by_key, OUTCOME_COLUMNS)}

Training dynamics: H gen. = entropy of the sampling distribution over all generated responses, "end" = mean
over the last 10% of steps, "min" = the minimum of its 10%-of-steps moving average; length drift = mean length
over the last 10% of steps minus the first 10%; other columns are means over steps.

{markdown_table(rows, by_key, DYNAMICS_COLUMNS)}

Where the clip binds: the share of the update's tokens it stops ("tokens") and their share of the output layer's
per-token gradient norms ("gradient"), each a mean over steps; the tokens the upper clip could reach at all
(A > 0, π_old < 1/(1+ε_high)); those with A > 0 and ρ in [1.2, 1.28), the only ones whose loss clip-higher
changes; the share of each side's clipped tokens with π_old < 0.2 and their mean π_old (token-weighted over
all steps; the `clip_high_p_old_K` / `clip_low_p_old_K` histograms, Fig. 3 below).

{markdown_table(rows, by_key, GRAD_COLUMNS)}
{epoch_table}
Comparisons, one family: each a difference of seed means (Welch) or, for the gradient against the token
share, of the same runs (paired).

{comparisons(rows, by_key)}

## Figures

Mean curve and ±1 sd band over seeds; per-step metrics smoothed over 5% of the steps.

{fig_lines}

{FINDINGS_PLACEHOLDER}"""
    write_page(out, text)
    return missing
