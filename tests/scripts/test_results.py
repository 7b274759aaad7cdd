"""Figures the docs quote from experiments are recomputed from the runs kept in results/ (scripts/archive_runs.py):
a page cannot drift from the runs behind it."""

from pathlib import Path

from tests.conftest import load_script

league = load_script("league")
experiment = __import__("sys").modules["experiment"]
stage_compare = load_script("stage_compare")
REPO = Path(__file__).resolve().parents[2]


def _cells(folder: Path, key: str, digits: int = 3) -> str:
    runs = [experiment.read_run(p) for p in sorted(folder.glob("seed*"))]
    return experiment.fmt_cell(experiment.column([experiment.summarize_run(r, None) for r in runs], key), digits)


def test_process_supervision_with_the_stop_scored_as_docs_league_md_says():
    folder = REPO / "results" / "process_stop" / "grpo_process"
    assert len(list(folder.glob("seed*"))) == 3
    page = (REPO / "docs" / "league.md").read_text()
    acc, passk, drift = _cells(folder, "final_acc"), _cells(folder, "final_pass"), _cells(folder, "len_drift", 1)
    assert (acc, passk, drift) == ("0.400 ± 0.017", "0.717 ± 0.025", "2.3 ± 3.5")
    assert f"**{acc}** (pass@4 {passk}), length drift {drift} tokens" in page


def test_the_recent_objectives_table_is_the_one_the_kept_runs_give():
    """docs/league_recent.md's results row of every objective is recomputed from results/league_recent, and
    the figures its findings quote are those cells."""
    page = (REPO / "docs" / "league_recent.md").read_text()
    folder = REPO / "results" / "league_recent"
    quoted = {"grpo": "0.376 ± 0.045", "dapo": "0.332 ± 0.029", "dapo_geo_mask": "0.302 ± 0.068",
              "dapo_bypass_geo_mask": "0.065 ± 0.033", "dapo_k3_mask": "0.339 ± 0.034", "grpo_v32": "0.285 ± 0.053",
              "skywork_or1": "0.241 ± 0.016", "kl_cov": "0.151 ± 0.038", "clip_cov": "0.207 ± 0.054"}
    rows = {r.key: r for r in league.ROWS}
    for key in sorted(p.name for p in folder.iterdir() if p.is_dir()):
        assert len(list((folder / key).glob("seed*"))) == 3, key
        acc, passk = _cells(folder / key, "final_acc"), _cells(folder / key, "final_pass")
        assert f"| {rows[key].label} | {acc} |" in page, (key, acc)
        assert passk in page, (key, passk)
        if key in quoted:
            assert acc == quoted[key] and acc in page.split("## Findings")[1], (key, acc)


def test_the_stage_comparison_in_docs_stages_md_is_the_one_the_kept_chains_give():
    """docs/stages.md's tables of cold start, distillation and rejection sampling against DAPO alone are what
    scripts/stage_compare.py reports from the chains kept in results/stage_compare, line for line."""
    folder = REPO / "results" / "stage_compare"
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["cold_start", "dapo", "distill"]
    page = (REPO / "docs" / "stages.md").read_text()
    table = stage_compare.report(folder, (0, 1, 2))
    for line in table.splitlines():
        assert line in page, line


def test_the_ablation_ladder_in_docs_ablation_md_is_the_one_the_kept_runs_give():
    """docs/ablation.md's outcome, dynamics and effect tables (DAPO's Table 1 in its order, 5 seeds) are what
    scripts/ablate.py reports from the runs kept in results/ablate, line for line."""
    from dapo_jax.training.config.paths import CONFIG_DIR
    from dapo_jax.training.config.run import load_config

    ablate = load_script("ablate")
    config = CONFIG_DIR / "cot_dapo.yaml"
    cfg = load_config(config)
    plan = ablate.make_plan(config, cfg, steps=60, eval_every=10, seeds=5, runs_dir=REPO / "results" / "ablate")
    rows, _ = ablate.define_rows(cfg.objective_config)
    assert sorted(p.name for p in plan.runs_dir.iterdir() if p.is_dir()) == sorted(r.key for r in rows)
    summaries, runs, target, missing = ablate.summarize_all(plan, rows, None)
    assert not missing and all(len(v) == 5 for v in summaries.values())
    page = (REPO / "docs" / "ablation.md").read_text()
    for table in (ablate.markdown_table(rows, summaries, ablate.OUTCOME_COLUMNS),
                  ablate.markdown_table(rows, summaries, ablate.DYNAMICS_COLUMNS),
                  ablate.equal_budget_table(rows, runs), ablate.effects_table(rows, summaries)):
        for line in table.splitlines():
            assert line in page, line


def test_the_learning_rate_sweep_in_docs_league_lr_md_is_the_one_the_kept_runs_give():
    """docs/league_lr.md's tables (the sweep, best rate against shared, against GRPO, GRPO at every rate) are what
    scripts/lr_sweep.py reports from the finished runs kept in results/lr_sweep, line for line; every kept run is
    a finished one, and none is missing."""
    import json

    lr_sweep = load_script("lr_sweep")
    folder = REPO / "results" / "lr_sweep"
    kept = sorted(folder.glob("lr*/*/seed*"))
    assert kept and all(json.loads((run / "experiment.json").read_text())["finished"] for run in kept)
    sweep = lr_sweep.make_sweep(lr_sweep.default_config(), (), lrs=lr_sweep.DEFAULT_LRS, sweep_seeds=2,
                                confirm_seeds=5, runs_dir=folder)
    rows = [r for r in lr_sweep.league.ROWS if r.key in lr_sweep.DEFAULT_ROWS]
    page = (REPO / "docs" / "league_lr.md").read_text()
    table = lr_sweep.sweep_table(sweep, rows)
    assert any("| 0." in line for line in table.splitlines()[2:])  # at least one measured cell
    assert not lr_sweep.unfinished(sweep, rows) and "Partial results" not in page
    tables = [table, lr_sweep.confirm_table(sweep, rows), lr_sweep.baseline_table(sweep),
              *(lr_sweep.versus_grpo(sweep, rows, at_best=b) for b in (False, True)),
              lr_sweep.versus_grpo(sweep, rows, at_best=True, baseline="top")]
    for line in "\n".join(tables).splitlines():
        assert line in page, line


def _clip_grid_page_matches(page: str, folder: str, keys: tuple[str, ...], columns: tuple[str, ...], extra=()):
    """The page's tables (`columns`: clip_grid_report's) and comparisons are what scripts/clip_grid.py reports from
    results/FOLDER (5 seeds of each of the rows `keys`, all finished), line for line."""
    from dapo_jax.training.config.paths import CONFIG_DIR
    from dapo_jax.training.config.run import load_config

    clip_grid = load_script("clip_grid")
    report = load_script("clip_grid_report")
    config = CONFIG_DIR / "cot_dapo.yaml"
    cfg = load_config(config, list(extra))
    plan = clip_grid.make_plan(config, cfg, steps=50, eval_every=25, seeds=5, runs_dir=REPO / "results" / folder,
                               extra=tuple(extra))
    rows = [r for r in clip_grid.define_rows(cfg.objective_config) if r.key in keys]
    assert sorted(p.name for p in plan.runs_dir.iterdir() if p.is_dir()) == sorted(keys) == sorted(r.key for r in rows)
    by_key, _, missing = report.summaries(plan, rows)
    assert not missing and all(len(v) == 5 for v in by_key.values())
    for r in rows:  # the runs were planned with the page's overrides
        assert load_config(config, ["train.run_dir=/x", *clip_grid.job(plan, r, 0).overrides]).optim.epochs == \
            cfg.optim.epochs
    text = (REPO / "docs" / page).read_text()
    tables = [experiment.markdown_table(rows, by_key, getattr(report, c)) for c in columns]
    for table in (*tables, report.comparisons(rows, by_key)):
        for line in table.splitlines():
            assert line in text, line


def test_the_clip_grid_in_docs_clip_grid_md_is_the_one_the_kept_runs_give():
    """docs/clip_grid.md: the clip ranges and the random arms (the symmetric one a follow-up family), 5 seeds, 16
    updates per rollout."""
    _clip_grid_page_matches("clip_grid.md", "clip_grid", ("l0.1-h0.2", "l0.1-h0.28", "l0.2-h0.2", "l0.2-h0.28",
                                                          "l0.3-h0.2", "l0.3-h0.28", "random", "random-sym"),
                            ("OUTCOME_COLUMNS", "DYNAMICS_COLUMNS", "GRAD_COLUMNS"))


def test_the_two_pass_clip_grid_in_docs_clip_grid_epochs2_md_is_the_one_the_kept_runs_give():
    """docs/clip_grid_epochs2.md: the ε_low 0.2 rows with optim.epochs=2, the per-pass clip fractions included."""
    _clip_grid_page_matches("clip_grid_epochs2.md", "clip_grid_epochs2", ("l0.2-h0.2", "l0.2-h0.28"),
                            ("OUTCOME_COLUMNS", "GRAD_COLUMNS", "EPOCH_COLUMNS"), extra=("optim.epochs=2",))
