"""scripts/lr_sweep.py: each run is the league's at one rate, the best rate is chosen on the sweep seeds and
judged on other seeds, and the report's tests are Welch's with Holm's correction."""

import json
from pathlib import Path

import pytest
from scipy import stats

from dapo_jax.training.config.paths import CONFIG_DIR
from dapo_jax.training.config.run import load_config
from tests.conftest import load_script

lr_sweep = load_script("lr_sweep")
league = lr_sweep.league
COT = CONFIG_DIR / "cot_dapo.yaml"
ROWS = {r.key: r for r in league.ROWS}


def make(tmp_path, lrs=(5e-5, 1e-4, 2e-4), sweep_seeds=2, confirm_seeds=3):
    return lr_sweep.make_sweep(COT, (), lrs=lrs, sweep_seeds=sweep_seeds, confirm_seeds=confirm_seeds,
                               runs_dir=tmp_path)


def write_finished(job, final_acc: float):
    """A finished fake run of `job`: step-0 and final evaluations, two train steps, the done file."""
    job.path.mkdir(parents=True, exist_ok=True)
    (job.path / "config.yaml").write_text(json.dumps({"rollout": {"G": 8}}))
    rows = [{"step": 0, "eval/accuracy": 0.2}, {"step": 1, "generated_groups": 16, "entropy_generated": 0.1},
            {"step": 2, "generated_groups": 16, "entropy_generated": 0.1}, {"step": 2, "eval/accuracy": final_acc}]
    (job.path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    (job.path / "experiment.json").write_text(json.dumps({"steps": 2, "finished": True, "wall_s": [1.0]}))


def test_each_run_is_the_league_run_at_its_rate(tmp_path):
    sweep = make(tmp_path)
    assert sweep.shared == 2e-4 and sweep.sweep_seeds == (0, 1) and sweep.confirm_seeds == (2, 3, 4)
    for lr in sweep.lrs:
        for key in ("grpo", "ppo"):
            j = lr_sweep.job(sweep, ROWS[key], lr, 3)
            cfg = load_config(COT, list(j.overrides))
            assert cfg.optim.lr == lr and cfg.train.seed == 3 and cfg.data.order_seed == 3
            assert j.path == tmp_path / f"lr{lr:g}" / key / "seed3" and j.key == f"{key}@{lr:g}"
            # everything else is the league's run of that row
            shared = league.run_overrides(league.make_plan(COT, load_config(COT), budget=10240, eval_samples=1280,
                                                           eval_size=100, seeds=5, runs_dir=tmp_path), load_config(COT),
                                          ROWS[key], 3)
            assert [o for o in j.overrides if "optim.lr" not in o and "run_dir" not in o and "critic.lr" not in o] == \
                   [o for o in shared if "run_dir" not in o and "critic.lr" not in o]
        critic = load_config(COT, list(lr_sweep.job(sweep, ROWS["ppo"], lr, 0).overrides)).critic.lr
        assert critic == pytest.approx(2 * lr)  # a critic's rate follows the policy's, as in the league
    with pytest.raises(SystemExit, match="not one of --lrs"):
        make(tmp_path, lrs=(5e-5, 1e-4))


def test_the_best_rate_is_chosen_on_the_sweep_seeds_and_judged_on_others(tmp_path):
    sweep = make(tmp_path)
    grpo, dapo = ROWS["grpo"], ROWS["dapo"]
    assert lr_sweep.best_lr(sweep, grpo) is None and lr_sweep.confirm_jobs(sweep, [grpo]) == []
    accs = {5e-5: (0.30, 0.34), 1e-4: (0.40, 0.36), 2e-4: (0.20, 0.30)}
    for lr, values in accs.items():
        for seed, acc in zip(sweep.sweep_seeds, values):
            write_finished(lr_sweep.job(sweep, grpo, lr, seed), acc)
            write_finished(lr_sweep.job(sweep, dapo, lr, seed), 0.3)  # all rates tie: the shared one
    assert lr_sweep.finished_values(sweep, grpo, 1e-4, sweep.sweep_seeds) == [0.40, 0.36]
    assert lr_sweep.best_lr(sweep, grpo) == 1e-4 and lr_sweep.best_lr(sweep, dapo) == 2e-4
    jobs = lr_sweep.confirm_jobs(sweep, [grpo, dapo])
    # the baseline (GRPO) at every rate; another row at its best and the shared rate (once where they agree)
    assert {(j.key, j.seed) for j in jobs} == {(f"{k}@{lr:g}", s) for s in (2, 3, 4) for k, lr in
                                               (("grpo", 5e-5), ("grpo", 1e-4), ("grpo", 2e-4), ("dapo", 2e-4))}
    assert not {j.seed for j in jobs} & set(sweep.sweep_seeds)
    # sweep jobs: seed 0 of every (rate, row) before any seed 1
    order = [(j.seed, j.key) for j in lr_sweep.sweep_jobs(sweep, [grpo, dapo])]
    assert [s for s, _ in order] == [0] * 6 + [1] * 6


def test_report_tests_best_against_shared_with_welch_and_holm(tmp_path):
    sweep = make(tmp_path, sweep_seeds=1, confirm_seeds=3)
    rows = [ROWS["grpo"], ROWS["rloo"], ROWS["dapo"]]
    sweep_acc = {"grpo": {5e-5: 0.2, 1e-4: 0.3, 2e-4: 0.25}, "rloo": {5e-5: 0.4, 1e-4: 0.2, 2e-4: 0.1},
                 "dapo": {5e-5: 0.1, 1e-4: 0.1, 2e-4: 0.3}}
    confirm = {("grpo", 1e-4): [0.31, 0.33, 0.35], ("grpo", 2e-4): [0.20, 0.26, 0.29],
               ("rloo", 5e-5): [0.40, 0.42, 0.47], ("rloo", 2e-4): [0.10, 0.15, 0.12],
               ("dapo", 2e-4): [0.33, 0.30, 0.36]}
    for key, by_lr in sweep_acc.items():
        for lr, acc in by_lr.items():
            write_finished(lr_sweep.job(sweep, ROWS[key], lr, 0), acc)
    for (key, lr), values in confirm.items():
        for seed, acc in zip(sweep.confirm_seeds, values):
            write_finished(lr_sweep.job(sweep, ROWS[key], lr, seed), acc)
    table = lr_sweep.confirm_table(sweep, rows)
    p_grpo = stats.ttest_ind(confirm["grpo", 1e-4], confirm["grpo", 2e-4], equal_var=False).pvalue
    p_rloo = stats.ttest_ind(confirm["rloo", 5e-5], confirm["rloo", 2e-4], equal_var=False).pvalue
    holm = sorted([p_grpo, p_rloo])
    adjusted = {p: min(1.0, max(2 * holm[0], holm[1] if p == holm[1] else 0)) for p in holm}
    grpo_line = next(x for x in table.splitlines() if x.startswith("| GRPO |"))
    rloo_line = next(x for x in table.splitlines() if x.startswith("| RLOO |"))
    assert grpo_line.startswith("| GRPO | 0.0001 | 0.330 ± 0.020 | 0.250 ± 0.046 | +0.080 [")
    assert f"| {p_grpo:.3f} | {adjusted[p_grpo]:.3f} |" in grpo_line
    assert f"| {p_rloo:.3f} | {adjusted[p_rloo]:.3f} | separable |" in rloo_line
    assert "Best at the shared rate 0.0002 (one set of runs): DAPO." in table
    sweep_lines = lr_sweep.sweep_table(sweep, rows).splitlines()
    assert sweep_lines[0] == "| row | lr 5e-05 | lr 0.0001 | lr 0.0002 (shared) | best rate |"
    assert sweep_lines[3] == "| RLOO | 0.400 | 0.200 | 0.100 | 5e-05 |"
    # against GRPO at each row's best rate: RLOO at 5e-5 vs GRPO at 1e-4
    best = lr_sweep.versus_grpo(sweep, rows, at_best=True)
    line = next(x for x in best.splitlines() if x.startswith("| RLOO |"))
    p = stats.ttest_ind(confirm["rloo", 5e-5], confirm["grpo", 1e-4], equal_var=False).pvalue
    assert line.startswith("| RLOO | 5e-05 | 0.430 ± 0.036 | 0.330 ± 0.020 | +0.100 [") and f"| {p:.3f} |" in line
    shared = lr_sweep.versus_grpo(sweep, rows, at_best=False)
    assert "| RLOO | 0.0002 | 0.123 ± 0.025 | 0.250 ± 0.046 |" in shared


def test_grpo_is_confirmed_at_every_rate_and_rows_are_also_judged_against_its_best(tmp_path):
    sweep = make(tmp_path, sweep_seeds=1, confirm_seeds=3)
    rows = [ROWS["grpo"], ROWS["rloo"]]
    for lr in sweep.lrs:  # GRPO's sweep chooses the shared 2e-4, RLOO's 5e-5
        write_finished(lr_sweep.job(sweep, ROWS["grpo"], lr, 0), 0.3 if lr == 2e-4 else 0.2)
        write_finished(lr_sweep.job(sweep, ROWS["rloo"], lr, 0), 0.4 if lr == 5e-5 else 0.1)
    confirm = {("grpo", 5e-5): [0.40, 0.44, 0.42], ("grpo", 1e-4): [0.30, 0.35, 0.31],
               ("grpo", 2e-4): [0.20, 0.26, 0.29], ("rloo", 5e-5): [0.40, 0.42, 0.47], ("rloo", 2e-4): [0.1, 0.15, 0.12]}
    assert lr_sweep.baseline_top(sweep) is None  # not before GRPO has a confirmation run at every rate
    assert "has not finished" in lr_sweep.versus_grpo(sweep, rows, at_best=True, baseline="top")
    for (key, lr), values in confirm.items():
        for seed, acc in zip(sweep.confirm_seeds, values):
            write_finished(lr_sweep.job(sweep, ROWS[key], lr, seed), acc)
    assert lr_sweep.baseline_top(sweep) == 5e-5  # the highest confirmation mean, not the sweep's choice
    table = lr_sweep.baseline_table(sweep)
    p = {lr: stats.ttest_ind(confirm["grpo", lr], confirm["grpo", 2e-4], equal_var=False).pvalue for lr in (5e-5, 1e-4)}
    low, high = sorted(p.values())
    holm = {lr: min(1.0, 2 * low) if p[lr] == low else max(2 * low, high) for lr in p}
    line = next(x for x in table.splitlines() if x.startswith("| 5e-05 |"))
    assert line.startswith("| 5e-05 | 0.420 ± 0.020 | 0.250 ± 0.046 | +0.170 [") and f"| {holm[5e-5]:.3f} |" in line
    line = next(x for x in table.splitlines() if x.startswith("| 0.0001 |"))
    assert f"| {p[1e-4]:.3f} | {holm[1e-4]:.3f} |" in line and "| 0.0002 |" not in table
    # RLOO at 5e-5 against GRPO at its sweep-chosen 2e-4, then at its confirmed best 5e-5
    chosen = lr_sweep.versus_grpo(sweep, rows, at_best=True)
    assert "| RLOO | 5e-05 | 0.430 ± 0.036 | 0.250 ± 0.046 | +0.180 [" in chosen
    top = lr_sweep.versus_grpo(sweep, rows, at_best=True, baseline="top")
    assert "| GRPO (lr 5e-05) |" in top and "| RLOO | 5e-05 | 0.430 ± 0.036 | 0.420 ± 0.020 | +0.010 [" in top
    p_top = stats.ttest_ind(confirm["rloo", 5e-5], confirm["grpo", 5e-5], equal_var=False).pvalue
    assert f"| {p_top:.3f} | {p_top:.3f} | not separable |" in top


def test_the_script_trains_the_sweep_then_the_confirmation_and_a_rerun_trains_nothing(tmp_path, monkeypatch):
    import dapo_jax.training.loop as loop

    trained = []

    def fake_train(cfg):  # avg@4 rises with the rate for GRPO, falls for DAPO
        run = Path(cfg.train.run_dir)
        trained.append((run.parent.name, cfg.optim.lr, cfg.train.seed))
        acc = 0.2 + (1000 if run.parent.name == "grpo" else -1000) * cfg.optim.lr + 0.001 * cfg.train.seed
        write_finished(lr_sweep.Job("x", 0, "x", run, COT, (), 2), acc)
        return {"step": 2, "eval/accuracy": acc}

    monkeypatch.setattr(loop, "train", fake_train)
    out = tmp_path / "league_lr.md"
    argv = ["--rows", "grpo,dapo", "--lrs", "1e-4,2e-4", "--sweep-seeds", "1", "--confirm-seeds", "2", "--jobs", "1",
            "--no-compile-cache", "--runs-dir", str(tmp_path / "runs"), "--out", str(out)]
    assert lr_sweep.main(argv) == 0
    assert trained[:4] == [("grpo", 1e-4, 0), ("dapo", 1e-4, 0), ("grpo", 2e-4, 0), ("dapo", 2e-4, 0)]
    # GRPO's best is the shared 2e-4, but the baseline runs at every rate; DAPO's best is 1e-4 (both rates);
    # on seeds 1 and 2
    assert sorted(trained[4:]) == sorted([(k, lr, s) for s in (1, 2) for k in ("grpo", "dapo") for lr in (1e-4, 2e-4)])
    text = out.read_text()
    assert "Partial results" not in text and "| DAPO | 0.100 | 0.000 | 0.0001 |" in text
    assert "Best at the shared rate 0.0002 (one set of runs): GRPO." in text and "## Findings" in text
    n = len(trained)
    assert lr_sweep.main(argv) == 0 and len(trained) == n  # everything finished: nothing trained again
    # a --jobs child trains the one run it is given (ROW@RATE/SEED)
    assert lr_sweep.main([*argv, "--only", "grpo@0.0001/7"]) == 0 and trained[-1] == ("grpo", 1e-4, 7)


def test_an_unfinished_sweep_is_reported_as_partial(tmp_path):
    sweep = make(tmp_path, lrs=(1e-4, 2e-4), sweep_seeds=1, confirm_seeds=1)
    write_finished(lr_sweep.job(sweep, ROWS["grpo"], 1e-4, 0), 0.3)
    out = tmp_path / "page.md"
    lr_sweep.write_report(out, sweep, [ROWS["grpo"]], "python scripts/lr_sweep.py")
    text = out.read_text()
    assert "**Partial results.** 1 run(s) not finished" in text and "grpo@0.0002/seed0" in text
    assert "(their sweep is not finished, so their confirmation has not started): GRPO." in text
    assert "| GRPO | 0.300 | – | – |" in text


def test_a_comparison_on_fewer_confirmation_seeds_says_how_many(tmp_path):
    """While the confirmation runs, a cell over fewer seeds than planned carries its count, and the test uses
    the seeds that finished (Welch's unequal n)."""
    sweep = make(tmp_path, lrs=(1e-4, 2e-4), sweep_seeds=1, confirm_seeds=3)
    write_finished(lr_sweep.job(sweep, ROWS["rloo"], 1e-4, 0), 0.4)
    write_finished(lr_sweep.job(sweep, ROWS["rloo"], 2e-4, 0), 0.1)
    best, shared = [0.40, 0.44, 0.47], [0.10, 0.16]
    for seed, acc in zip(sweep.confirm_seeds, best):
        write_finished(lr_sweep.job(sweep, ROWS["rloo"], 1e-4, seed), acc)
    for seed, acc in zip(sweep.confirm_seeds, shared):
        write_finished(lr_sweep.job(sweep, ROWS["rloo"], 2e-4, seed), acc)
    line = next(x for x in lr_sweep.confirm_table(sweep, [ROWS["rloo"]]).splitlines() if x.startswith("| RLOO |"))
    p = stats.ttest_ind(best, shared, equal_var=False).pvalue
    assert line.startswith("| RLOO | 0.0001 | 0.437 ± 0.035 | 0.130 ± 0.042 (n=2) | +0.307 [")
    assert f"| {p:.3f} | {p:.3f} |" in line  # one test: Holm leaves it as it is


def test_bad_rates_are_one_line_errors(capsys):
    for bad in ("1e-4,x", "0,1e-4"):
        with pytest.raises(SystemExit) as e:
            lr_sweep.parse_args(["--lrs", bad])
        assert e.value.code == 2 and "--lrs" in capsys.readouterr().err
