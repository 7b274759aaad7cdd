"""scripts/league.py's bookkeeping, without real training: every row is its recipe at the same budget
of generated samples and otherwise the same run, a rerun trains only what is unfinished, and the
table is mean ± sd of what hand-made runs' metrics hold."""

import json
import sys
from pathlib import Path

import numpy as np
import pytest

from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.config.paths import CONFIG_DIR
from dapo_jax.training.config.run import load_config
from tests.conftest import load_script

REPO = Path(__file__).resolve().parents[2]
COT = CONFIG_DIR / "cot_dapo.yaml"


league = load_script("league")
experiment = sys.modules["experiment"]


def plan_for(tmp_path, *, budget=10240, seeds=3, eval_samples=1280):
    cfg = load_config(COT)
    return cfg, league.make_plan(COT, cfg, budget=budget, eval_samples=eval_samples, eval_size=100, seeds=seeds,
                                 runs_dir=tmp_path)


def test_every_objective_of_the_project_is_a_row():
    from dapo_jax.objectives.registry import available_objectives, load_objective

    rl = [n for n in available_objectives() if not load_objective(n).supervised]  # sft samples nothing: no row
    assert sorted(r.recipe for r in league.ROWS) == sorted(rl)
    assert len({r.key for r in league.ROWS}) == len(league.ROWS)


def test_rows_are_their_recipes_at_one_budget_of_generated_samples(tmp_path):
    cfg, plan = plan_for(tmp_path)
    assert plan.samples_per_round == 16 * 8 and plan.cap == 80  # 80 steps of one round reach 10,240
    runs = {r.key: load_config(COT, league.run_overrides(plan, cfg, r, 1)) for r in league.ROWS}
    for row in league.ROWS:
        run, own = runs[row.key], load_objective(row.recipe)
        got = run.objective_config.model_dump()
        want = own.model_dump()
        # the recipe as published: only the overlong buffer (scaled to CONFIG's) and max_response_length
        # (the sampler's) may differ, and value pre-training only where it would not fit
        diff = {k for k in want if got[k] != want[k]}
        assert diff <= {"overlong_buffer", "max_response_length"}, (row.key, diff)
        assert got["overlong_buffer"] == (16 if own.overlong_buffer is not None else None), row.key
        pre = own.value_pretrain_steps * plan.samples_per_round
        assert run.train.max_samples == plan.budget - pre, row.key  # VAPO pays its pre-training rollouts
        assert run.train.steps == plan.cap and run.train.seed == 1 and run.data.eval_size == 100
        # evaluated every ~1,280 generated samples: dynamic sampling makes ~2 rounds a step
        assert run.train.eval_every == (5 if own.dynamic_sampling else 10), row.key
    assert runs["vapo"].train.max_samples == 10240 - 50 * 128
    assert runs["grpo"].objective_config.kl_beta == 0.04 and runs["grpo"].objective_config.needs_reference
    assert runs["dapo_tis"].sampler_dtype == "bfloat16" and runs["dapo_tis"].recompute_old_logp
    for key in ("ppo", "vapo"):  # the critic at twice the policy's lr, as VAPO publishes
        assert runs[key].critic_optim.lr == 2 * runs[key].optim.lr
    assert not runs["gdpo"].optim.packing

    # everything but the objective, the row's listed extras and the run's own folder is the same run
    def rest(run, row):
        d = run.model_dump(mode="json")
        for key in ("objective", "critic"):
            d.pop(key)
        for k in ("run_dir", "max_samples", "eval_every"):
            d["train"].pop(k)
        for extra in row.extra:
            section, field = extra.split("=")[0].split(".")
            d[section].pop(field)
        return d

    first = rest(runs["grpo"], league.ROWS[0])
    for row in league.ROWS:
        other = rest(runs[row.key], row)
        for section in first:
            if isinstance(first[section], dict):
                shared = {k: v for k, v in first[section].items() if k in other[section]}
                assert shared == {k: other[section][k] for k in shared}, (row.key, section)


def test_a_quick_league_shortens_vapo_pre_training_to_leave_the_policy_a_quarter(tmp_path):
    cfg, plan = plan_for(tmp_path, budget=2048, seeds=1, eval_samples=1024)
    vapo = next(r for r in league.ROWS if r.key == "vapo")
    run = load_config(COT, league.run_overrides(plan, cfg, vapo, 0))
    assert run.objective_config.value_pretrain_steps == 12 and run.train.max_samples == 2048 - 12 * 128
    assert league.jobs(plan, cfg, list(league.ROWS))[0].key == "grpo"
    _, plan3 = plan_for(tmp_path)
    order = [(j.seed, j.key) for j in league.jobs(plan3, cfg, list(league.ROWS[:2]))]
    assert order == [(0, "grpo"), (0, "dapo"), (1, "grpo"), (1, "dapo"), (2, "grpo"), (2, "dapo")]  # seed 0 first


# ----------------------------------------------------------------------------- hand-made runs
G = 8


def write_run(path: Path, *, groups: list[int], accs: dict[int, float], entropy: list[float],
              lengths: list[float], wall: float = 100.0):
    """A finished fake run: one train row per step, evaluations at the steps of `accs`."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.yaml").write_text(json.dumps({"rollout": {"G": G}}))
    lines = []
    for s in range(len(groups) + 1):
        row = {"step": s}
        if s:
            row.update(generated_groups=groups[s - 1], entropy_generated=entropy[s - 1],
                       response_length_mean=lengths[s - 1], truncated_fraction=0.01 * s)
        if s in accs:
            row.update({"eval/accuracy": accs[s], "eval/pass@4": accs[s] + 0.3, "eval/maj@4": accs[s] + 0.1})
        lines.append(row)
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    experiment.record(path, steps=len(groups), finished=True, wall_s=[wall])


def test_the_table_is_mean_and_sd_of_hand_made_runs_with_pre_training_counted(tmp_path):
    cfg, plan = plan_for(tmp_path, budget=640, seeds=2, eval_samples=256)
    rows = [r for r in league.ROWS if r.key in ("grpo", "dapo", "vapo")]
    ten = [0.2] * 10
    # grpo: 5 steps of 16 groups (640 samples); dapo: 2-3 rounds a step
    for seed, final in zip(plan.seeds, (0.30, 0.40)):
        write_run(league.run_dir(plan, rows[0], seed), groups=[16] * 5, accs={0: 0.2, 2: 0.25, 5: final},
                  entropy=[0.5, 0.4, 0.3, 0.2, 0.1], lengths=[80, 82, 84, 86, 88])
    write_run(league.run_dir(plan, rows[1], 0), groups=[32, 48], accs={0: 0.2, 1: 0.35, 2: 0.5}, entropy=ten[:2],
              lengths=[80, 70])
    write_run(league.run_dir(plan, rows[1], 1), groups=[48, 32], accs={0: 0.2, 1: 0.25, 2: 0.4}, entropy=ten[:2],
              lengths=[80, 70])
    # vapo pre-training took 3 steps x 128 samples (3/4 of the budget 640): its policy steps start at 384
    assert league.pretrain_samples(plan, rows[2]) == 384
    write_run(league.run_dir(plan, rows[2], 0), groups=[16] * 2, accs={0: 0.2, 2: 0.35}, entropy=ten[:2],
              lengths=[80] * 2)
    summaries, runs, offsets, target, missing = league.summarize_all(plan, cfg, rows, None)
    assert missing == ["vapo/seed1"] and target == pytest.approx(0.3)  # step-0 mean 0.2 + 0.1
    grpo, dapo, vapo = (summaries[k] for k in ("grpo", "dapo", "vapo"))
    assert [s["samples"] for s in grpo] == [640, 640] and [s["samples"] for s in dapo] == [640, 640]
    assert vapo[0]["samples"] == 384 + 2 * 128 and vapo[0]["steps"] == 2
    # first evaluation at or above 0.3: grpo seed 0 at step 5 (640), seed 1 at step 5; dapo at step 1 (256 / 384)
    assert [s["samples_to_target"] for s in grpo] == [640, 640]
    assert [s["samples_to_target"] for s in dapo] == [256, 640]
    assert vapo[0]["samples_to_target"] == 384 + 256  # pre-training samples included
    assert grpo[0]["len_drift"] == pytest.approx(88 - 80) and dapo[0]["len_drift"] == pytest.approx(-10)

    table = league.markdown_table(rows, summaries, league.TABLE_COLUMNS, first="objective").splitlines()
    assert table[0].startswith("| objective | avg@4 at budget | best avg@4 | pass@4 | maj@4 | samples to target |")
    m, sd = np.mean([0.30, 0.40]), np.std([0.30, 0.40], ddof=1)
    assert table[2].startswith(f"| GRPO | {m:.3f} ± {sd:.3f} | {m:.3f} ± {sd:.3f} | {m + 0.3:.3f} ± {sd:.3f} | "
                               f"{m + 0.1:.3f} ± {sd:.3f} | 640 ± 0 | 5 ± 0 |")
    assert table[3].startswith("| DAPO | 0.450 ± 0.071 | 0.450 ± 0.071 |")
    assert table[4].startswith("| VAPO | 0.350 | 0.350 |")
    versus = league.versus_grpo(rows, summaries)
    dapo_line = next(x for x in versus.splitlines() if x.startswith("| DAPO |"))
    # Δ, its bootstrap interval and Welch's p, unmarked: two seeds a side cannot separate these
    welch_p = __import__("scipy").stats.ttest_ind([0.5, 0.4], [0.30, 0.40], equal_var=False).pvalue
    assert dapo_line.startswith(f"| DAPO | +{0.45 - m:.3f} [") and f"p={welch_p:.2f} |" in dapo_line
    assert "**" not in dapo_line and "over this table's" in versus and "not separable" in versus
    at = league.accuracy_at(rows, runs, offsets, fractions=(0.5,)).splitlines()
    # half of the smallest total (640): grpo's evaluations at 0, 256, 640 samples; dapo s0 at 0, 256, 640
    assert at[0] == "| row | avg@4 at 320 |"
    assert at[2].startswith(f"| GRPO | {0.25 + (0.35 - 0.25) * 64 / 384:.3f} ± ")  # the seeds' mean at 320

    figures = league.write_figures(tmp_path / "figures", rows, runs, offsets, plan.budget)
    assert sorted(p.name for p in figures) == ["league_dynamic_sampling.png", "league_group.png", "league_other.png",
                                               "league_ratio.png", "league_recent.png"]
    out = tmp_path / "league.md"
    text = league.write_report(out, plan, cfg, rows, summaries, runs, offsets, target, figures, "python x", missing)
    assert "**Partial results.**" in text and "vapo/seed1" in text and "(budget − 384 value pre-training samples)" in text
    assert all(f"figures/{p.name}" in text for p in figures)
    out.write_text(text.split("## Findings\n")[0] + "## Findings\n\nGRPO wins.\n")
    again = league.write_report(out, plan, cfg, rows, summaries, runs, offsets, target, figures, "python x", [])
    assert again.endswith("## Findings\n\nGRPO wins.\n") and "Partial results" not in again


def test_a_rerun_trains_only_the_unfinished_runs(tmp_path, monkeypatch):
    import dapo_jax.training.loop as loop

    trained, fail = [], {"rloo"}

    def fake_train(cfg):
        row, seed = Path(cfg.train.run_dir).parent.name, cfg.train.seed
        trained.append(f"{row}/{seed}")
        if row in fail:
            fail.remove(row)  # fails once
            raise RuntimeError("boom")
        per_step = 2 * 16 if cfg.objective_config.dynamic_sampling else 16
        steps = -(-cfg.train.max_samples // (per_step * G))
        write_run(Path(cfg.train.run_dir), groups=[per_step] * steps, accs={0: 0.2, steps: 0.3},
                  entropy=[0.2] * steps, lengths=[80.0] * steps)
        return {"step": steps, "eval/accuracy": 0.3}

    monkeypatch.setattr(loop, "train", fake_train)
    argv = ["--rows", "grpo,dapo,rloo", "--seeds", "1", "--budget", "1024", "--jobs", "1", "--no-compile-cache",
            "--runs-dir", str(tmp_path / "runs"), "--out", str(tmp_path / "league.md")]
    assert league.main(argv) == 1  # rloo failed; the others went on
    assert trained == ["grpo/0", "dapo/0", "rloo/0"]
    assert "rloo/seed0" in (tmp_path / "league.md").read_text()
    assert league.main(argv) == 0  # only the failed one again
    assert trained[3:] == ["rloo/0"]
    text = (tmp_path / "league.md").read_text()
    assert "Partial results" not in text and "| DAPO | 0.300 |" in text
    assert experiment.done(tmp_path / "runs" / "dapo" / "seed0")["steps"] == 4  # 1,024 samples at 256 a step
    load = json.loads((tmp_path / "runs" / "league_load.json").read_text())
    assert len(load["sessions"]) == 2
    assert league.main([*argv, "--report-only"]) == 0 and len(trained) == 4
