"""scripts/ablate.py: the ladder's rows are the intended objectives and otherwise identical runs,
the tables are mean ± sd over seeds of what metrics.jsonl holds, and the script runs end to end."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dapo_jax.training.config.run import load_config
from tests.conftest import load_script

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "dapo_jax" / "configs" / "tiny_dapo.yaml"


ablate = load_script("ablate")
experiment = sys.modules["experiment"]  # scripts/experiment.py, imported by the script


# ----------------------------------------------------------------------------- rows
def resolved(config: Path, tmp_path: Path, seeds: int = 1):
    """row key -> the RunConfig each row's first seed trains with; plus the dropped pairs."""
    cfg = load_config(config)
    plan = ablate.make_plan(config, cfg, steps=7, eval_every=2, seeds=seeds, runs_dir=tmp_path)
    rows, dropped = ablate.define_rows(cfg.objective_config)
    return cfg, plan, {r.key: load_config(config, ablate.run_overrides(plan, r, plan.seeds[0])) for r in rows}, dropped


def changed(a, b) -> set[str]:
    da, db = a.objective_config.model_dump(), b.objective_config.model_dump()
    return {k for k in da if k != "name" and da[k] != db[k]}


def test_rows_are_the_intended_objectives(tmp_path):
    base, _, runs, dropped = resolved(TINY, tmp_path)
    # DAPO's Table 1 in its order, then DAPO with Eq. 8's per-group token mean
    assert list(runs) == ["grpo", "filter", "clip", "soft", "token", "dapo", "dapo-eq8"] and not dropped
    naive = runs["grpo"].objective_config
    assert (naive.eps_low, naive.eps_high) == (0.2, 0.2)
    assert naive.loss_agg == "seq_mean_token_mean"
    assert not naive.dynamic_sampling and not naive.overlong_filtering and naive.overlong_buffer is None
    assert naive.kl_beta == 0.0 and not naive.needs_reference
    # full DAPO is CONFIG's own objective (tiny_dapo: clip-higher, token-mean, dynamic sampling, band 2)
    # with Table 1's overlong filtering on as well
    assert changed(runs["dapo"], base) == {"overlong_filtering"} and runs["dapo"].objective_config.overlong_filtering
    # the ladder adds one technique per row ...
    assert changed(runs["grpo"], runs["filter"]) == {"overlong_filtering"}
    assert changed(runs["filter"], runs["clip"]) == {"eps_high"} and runs["clip"].objective_config.eps_high == 0.28
    assert changed(runs["clip"], runs["soft"]) == {"overlong_buffer"}
    assert runs["soft"].objective_config.overlong_buffer == 2
    assert changed(runs["soft"], runs["token"]) == {"loss_agg"} and runs["token"].objective_config.loss_agg == "token_mean"
    assert changed(runs["token"], runs["dapo"]) == {"dynamic_sampling"}
    # ... and Eq. 8 differs from DAPO in the loss's normalisation alone
    assert changed(runs["dapo"], runs["dapo-eq8"]) == {"loss_agg"}
    assert runs["dapo-eq8"].objective_config.loss_agg == "group_mean_token_mean"


def test_rows_are_otherwise_identical_runs(tmp_path):
    _, plan, runs, _ = resolved(TINY, tmp_path, seeds=2)

    def rest(cfg):
        d = cfg.model_dump(mode="json")
        d.pop("objective")
        d["train"].pop("run_dir")
        return d

    first = rest(runs["grpo"])
    assert all(rest(c) == first for c in runs.values())
    assert first["train"]["steps"] == 7 and first["train"]["eval_every"] == 2 and first["train"]["seed"] == 0
    # no row throws away what it generates; dynamic sampling keeps CONFIG's budget (32 x 4 prompts)
    assert first["rollout"]["gen_batch"] == first["rollout"]["train_batch"] == 16
    assert first["rollout"]["max_gen_batches"] == 8
    assert len({c.train.run_dir for c in runs.values()}) == len(runs)
    assert plan.seeds == (0, 1)
    row = ablate.define_rows(runs["dapo"].objective_config)[0][0]
    seed1 = load_config(TINY, ablate.run_overrides(plan, row, 1))
    assert seed1.train.seed == 1 and seed1.train.run_dir.endswith("grpo/seed1")


def test_a_config_without_overlong_shaping_drops_the_rows_that_would_repeat(tmp_path):
    _, _, runs, dropped = resolved(REPO / "dapo_jax" / "configs" / "tiny_grpo.yaml", tmp_path)
    assert "soft" not in runs  # no soft overlong punishment in CONFIG: that rung equals the one before
    assert [(d.key, same.key) for d, same in dropped] == [("soft", "clip")]
    assert list(runs) == ["grpo", "filter", "clip", "token", "dapo", "dapo-eq8"]
    assert runs["grpo"].objective_config.kl_beta == 0.0  # tiny_grpo's own KL is 0.04


def test_override_values_read_back_exactly():
    import yaml

    for v in (1e-05, 0.28, 3e-4, None, True, False, "seq_mean_token_mean", 2, 1.0):
        assert yaml.safe_load(ablate.yaml_value(v)) == v and type(yaml.safe_load(ablate.yaml_value(v))) is type(v)


# ----------------------------------------------------------------------------- tables
G = 4


def write_run(path: Path, accs: list[float], entropy: list[float], generated: list[int], *, redo_step: int | None = None):
    """A fake run: eval every 2 steps (accs at steps 0, 2, 4, ...), one train row per step."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(json.dumps({"rollout": {"G": G}}))  # JSON is YAML
    lines = [{"step": 0, "eval/accuracy": accs[0], "eval/pass@4": accs[0] + 0.3}]
    for s in range(1, len(entropy) + 1):
        lines.append({"step": s, "entropy_generated": entropy[s - 1], "entropy": entropy[s - 1] - 0.1,
                      "generated_groups": generated[s - 1], "response_length_mean": 10.0 + s,
                      "response_length_std": 2.0, "truncated_fraction": 0.1 * s, "clip_frac_low": 0.01,
                      "clip_frac_high": 0.02, "zero_adv_fraction": 0.5, "gen_rounds": 1.0})
        if s % 2 == 0:
            lines.append({"step": s, "eval/accuracy": accs[s // 2], "eval/pass@4": accs[s // 2] + 0.3})
    if redo_step is not None:  # a resume redid this step: the last line wins
        lines.append({"step": redo_step, "entropy_generated": 0.35})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (path / ablate.DONE_FILE).write_text(json.dumps({"steps": len(entropy), "wall_s": [10.0, 2.5]}))


def test_summary_of_one_run(tmp_path):
    entropy = [1.0, 0.9, 0.8, 0.5, 0.7, 0.6, 0.4, 0.3, 0.2, 0.25]
    write_run(tmp_path / "r", [0.2, 0.3, 0.45, 0.4, 0.5, 0.6], entropy, [2, 3, 2, 2, 4, 2, 2, 2, 3, 2])
    s = ablate.summarize_run(ablate.read_run(tmp_path / "r"), target=0.42)
    assert s["start_acc"] == 0.2 and s["final_acc"] == 0.6 and s["best_acc"] == 0.6
    assert s["final_pass"] == pytest.approx(0.9)
    assert s["steps_to_target"] == 4  # the first evaluation >= 0.42
    assert s["samples_to_target"] == (2 + 3 + 2 + 2) * G  # responses generated up to and including step 4
    assert s["samples"] == sum([2, 3, 2, 2, 4, 2, 2, 2, 3, 2]) * G
    assert s["ent_gen_end"] == pytest.approx(0.25)  # window = 10% of 10 steps = 1
    assert s["ent_gen_min"] == pytest.approx(0.2) and s["ent_upd_min"] == pytest.approx(0.1)
    assert s["len_mean"] == pytest.approx(np.mean(10.0 + np.arange(1, 11)))
    assert s["len_sd_steps"] == pytest.approx(np.std(np.arange(1, 11)))
    assert s["trunc"] == pytest.approx(0.55) and s["trunc_end"] == pytest.approx(1.0)
    assert s["wall_s"] == 12.5
    assert ablate.summarize_run(ablate.read_run(tmp_path / "r"), target=0.95)["steps_to_target"] is None
    # only steps <= 6 when asked for a 6-step run
    s6 = ablate.summarize_run(ablate.read_run(tmp_path / "r", steps=6), target=None)
    assert s6["final_acc"] == 0.4 and s6["best_acc"] == 0.45 and "steps_to_target" not in s6


def test_tables_are_mean_and_sd_over_seeds(tmp_path):
    cfg = load_config(TINY)
    plan = ablate.make_plan(TINY, cfg, steps=4, eval_every=2, seeds=3, runs_dir=tmp_path)
    rows, _ = ablate.define_rows(cfg.objective_config)
    row, other = rows[0], rows[4]
    finals = [0.5, 0.6, 0.8]
    for seed, final in zip(plan.seeds, finals):
        # seed 2 reaches the target (0.45) at step 2, the others at step 4; row `other` never
        write_run(ablate.run_dir(plan, row, seed), [0.25, 0.5 if seed == 2 else 0.3, final],
                  [0.6, 0.5, 0.4, 0.3], [2, 2, 2, 2], redo_step=4)
        write_run(ablate.run_dir(plan, other, seed), [0.25, 0.3, 0.35], [0.6, 0.5, 0.4, 0.3], [4, 4, 4, 4])
    unfinished = ablate.define_rows(cfg.objective_config)[0][1]
    write_run(ablate.run_dir(plan, unfinished, 0), [0.9, 0.9], [0.1], [1])  # 1 of 4 steps: left out
    summaries, runs, target, missing = ablate.summarize_all(plan, [row, other, unfinished], target=None)
    assert missing == [f"{unfinished.key}/seed{s}" for s in plan.seeds] and summaries[unfinished.key] == []
    assert target == pytest.approx(0.45)  # the step-0 accuracy + 0.2
    assert len(summaries[row.key]) == 3 and len(runs[other.key]) == 3
    table = ablate.markdown_table([row, other], summaries, ablate.OUTCOME_COLUMNS)
    lines = table.splitlines()
    assert lines[0].startswith("| row | held-out acc. final | best |")
    mean, sd = np.mean(finals), np.std(finals, ddof=1)  # 0.633 ± 0.153
    assert f"| {row.label} | {mean:.3f} ± {sd:.3f} | {mean:.3f} ± {sd:.3f} |" in lines[2]
    steps = [4, 4, 2]
    assert f"{np.mean(steps):.0f} ± {np.std(steps, ddof=1):.0f}" in lines[2]
    assert "| not reached | not reached |" in lines[3]
    dynamics = ablate.markdown_table([row], summaries, ablate.DYNAMICS_COLUMNS)
    # the redone step 4 wins (entropy 0.35, not 0.3); end = the last step (a window of 10% of 4 steps)
    assert dynamics.splitlines()[2].startswith(f"| {row.label} | 0.350 ± 0.000 | 0.350 ± 0.000 | 0.200 ± 0.000 |")
    assert ablate.fmt_cell([1.0, None, 3.0]) == "2.000 ± 1.414 (2/3)"
    assert ablate.fmt_cell([0.5]) == "0.500" and ablate.fmt_cell([]) == "–"
    assert ablate.fmt_cell([1234.0, 2345.0], 0) == "1,790 ± 786"


# ----------------------------------------------------------------------------- end to end
@pytest.mark.slow
def test_script_end_to_end_two_steps_and_a_rerun_skips(tmp_path, monkeypatch):
    """One row (full DAPO: dynamic sampling on, the path with refill rounds), 2 steps, trained in a
    child process of the script (--jobs 2: the path every ladder takes by default)."""
    out = tmp_path / "docs" / "ablation.md"
    argv = [str(TINY), "--steps", "2", "--eval-every", "1", "--seeds", "1", "--rows", "dapo",
            "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--set", "data.eval_size=32",
            "--jobs", "2", "--no-compile-cache"]  # the cache is a process-wide setting: leave the other tests' alone
    assert ablate.main(argv) == 0
    for key in ("dapo",):
        run = tmp_path / "runs" / key / "seed0"
        assert json.loads((run / ablate.DONE_FILE).read_text())["steps"] == 2
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        train_rows = [r for r in rows if "entropy_generated" in r]
        assert len(train_rows) == 2 and all(r["entropy_generated"] > 0 for r in train_rows)
        assert all("zero_adv_fraction" in r for r in train_rows)
        assert f"training 2 steps in {run}" in (run / experiment.LOG_FILE).read_text()  # the child's own log
    text = out.read_text()
    assert "## Findings" in text and "Placeholder" in text
    results = text.split("## Results")[1]
    assert "| DAPO (+ dynamic sampling) |" in results and "| naive GRPO |" not in results
    table_rows = [x for x in results.splitlines() if x.startswith("| DAPO (+ dynamic sampling)")]
    # outcomes, accuracy at equal budgets of samples, dynamics: one row each; one seed: no sd
    assert len(table_rows) == 3 and all(" ± " not in x for x in table_rows)
    figures = sorted(p.name for p in (tmp_path / "docs" / "figures").glob("ablation_*.png"))
    assert figures == ["ablation_dynamic_sampling.png", "ablation_token_loss.png"]  # those that draw the row it has
    assert all(f"figures/{name}" in text for name in figures)

    # a rerun trains nothing: every run is finished
    import dapo_jax.training.loop as loop

    def no_training(cfg):
        raise AssertionError(f"{cfg.train.run_dir} was trained again")

    monkeypatch.setattr(loop, "train", no_training)
    assert ablate.main(argv) == 0


def fake_ablation(tmp_path, monkeypatch, *, seeds: int, rows: str, fails=lambda cfg: False):
    """`(argv, out, trained)`: ablate's command line on the tiny config, with the trainer replaced by one
    that writes a 4-step run (or raises when `fails(cfg)`) and records the rows it was called for."""
    import dapo_jax.training.loop as loop

    trained = []

    def fake_train(cfg):
        trained.append(Path(cfg.train.run_dir).parent.name)
        if fails(cfg):
            raise RuntimeError("boom")
        write_run(Path(cfg.train.run_dir), [0.2, 0.3, 0.4], [0.5, 0.4, 0.3, 0.2], [4, 4, 4, 4])
        return {"eval/accuracy": 0.4}

    monkeypatch.setattr(loop, "train", fake_train)
    out = tmp_path / "ablation.md"
    argv = [str(TINY), "--steps", "4", "--seeds", str(seeds), "--rows", rows, "--out", str(out),
            "--runs-dir", str(tmp_path / "runs"), "--no-compile-cache", "--jobs", "1"]
    return argv, out, trained


def test_a_failed_run_is_reported_and_the_others_go_on(tmp_path, monkeypatch):
    import dapo_jax.training.loop as loop
    from dapo_jax.training.state.guards import Preempted

    argv, out, trained = fake_ablation(tmp_path, monkeypatch, seeds=2, rows="grpo,dapo,clip",
                                       fails=lambda cfg: cfg.objective_config.dynamic_sampling)
    assert ablate.main(argv) == 1
    assert trained == ["grpo", "grpo", "clip", "clip", "dapo", "dapo"]  # ladder order, every seed
    text = out.read_text()
    assert "left out of the tables: dapo/seed0, dapo/seed1" in text
    assert "| naive GRPO | 0.400 ± 0.000 |" in text and "| DAPO (+ dynamic sampling) | no runs |" in text

    # SIGTERM stops the whole ladder (the next run would be killed too); finished runs are not redone
    def preempted(cfg):
        trained.append("preempted")
        raise Preempted("SIGTERM")

    monkeypatch.setattr(loop, "train", preempted)
    with pytest.raises(Preempted):
        ablate.main(argv)
    assert trained[6:] == ["preempted"]


def test_jobs_run_children_one_core_and_one_xla_thread_each_and_report_failures(tmp_path, monkeypatch):
    """--jobs 2: each run is a child process of the script (`--only ROW/SEED`) pinned to a core with a
    single-threaded XLA; a child that exits non-zero (or leaves its run unfinished) fails that run only."""
    calls = []
    real_run = subprocess.run

    def fake_run(cmd, env=None, stdout=None, stderr=None, preexec_fn=None, **kw):
        if "--only" not in cmd:  # e.g. lscpu for the report's machine line
            return real_run(cmd, stdout=stdout, stderr=stderr, **kw)
        only = cmd[cmd.index("--only") + 1]
        i = cmd.index("--only")
        assert cmd[i - 2:i] == ["--jobs", "1"]  # the child trains its one run itself
        calls.append((only, env["XLA_FLAGS"]))
        key, seed = only.split("/")
        run = tmp_path / "runs" / key / f"seed{seed}"
        if key == "dapo":
            return subprocess.CompletedProcess(cmd, 1)
        shutil.rmtree(run)  # the parent made it for the child's log
        write_run(run, [0.2, 0.3, 0.4], [0.5, 0.4, 0.3, 0.2], [4, 4, 4, 4])  # and marks it finished
        return subprocess.CompletedProcess(cmd, 0)

    monkeypatch.setattr(experiment.subprocess, "run", fake_run)
    out = tmp_path / "ablation.md"
    argv = [str(TINY), "--steps", "4", "--seeds", "1", "--rows", "grpo,dapo", "--out", str(out),
            "--runs-dir", str(tmp_path / "runs"), "--no-compile-cache", "--jobs", "2"]
    assert ablate.main(argv) == 1
    assert sorted(c[0] for c in calls) == ["dapo/0", "grpo/0"]
    assert all(ablate.SINGLE_THREAD_XLA in flags for _, flags in calls)
    text = out.read_text()
    assert "left out of the tables: dapo/seed0" in text and "| naive GRPO | 0.400 |" in text


def test_effects_pair_rows_that_differ_in_one_technique_and_compare_with_the_seed_spread():
    rows, _ = ablate.define_rows(load_config(TINY).objective_config)
    pairs = lambda t: [(a.key, b.key) for a, b in ablate.effect_pairs(rows, t)]  # noqa: E731
    # each rung against the one before it, and Eq. 8 against DAPO
    assert pairs("overlong_filtering") == [("filter", "grpo")]
    assert pairs("clip_higher") == [("clip", "filter")]
    assert pairs("soft_overlong") == [("soft", "clip")]
    assert pairs("token_loss") == [("token", "soft")]
    assert pairs("dynamic_sampling") == [("dapo", "token")]
    assert pairs("group_norm") == [("dapo-eq8", "dapo")]
    summaries = {"dapo": [{"final_acc": a} for a in (0.40, 0.42, 0.44)],  # mean 0.42, sd 0.02
                 "token": [{"final_acc": a} for a in (0.10, 0.20, 0.30)],  # mean 0.20, sd 0.10
                 "clip": [{"ent_gen_end": h} for h in (0.10, 0.12, 0.14)],
                 "filter": [{"ent_gen_end": h} for h in (0.11, 0.13, 0.15)]}
    table = ablate.effects_table(rows, summaries)
    from scipy import stats

    line = next(x for x in table.splitlines() if "`dapo` → `token`" in x and "held-out acc. final" in x)
    p1 = stats.ttest_ind([0.40, 0.42, 0.44], [0.10, 0.20, 0.30], equal_var=False).pvalue  # 0.067
    assert "| 0.4200 | 0.2000 | +0.2200 [" in line
    assert line.endswith(f"| {p1:.3f} | {min(1, 2 * p1):.3f} | not separable |")  # Holm over the 2 tests
    line = next(x for x in table.splitlines() if "`clip` → `filter`" in x and "H gen. end" in x)
    p2 = stats.ttest_ind([0.10, 0.12, 0.14], [0.11, 0.13, 0.15], equal_var=False).pvalue
    assert line.endswith(f"| {p2:.3f} | {min(1, max(2 * p1, p2)):.3f} | not separable |")
    assert "this table's 2 tests" in table
    assert "dapo-eq8" not in table  # rows without runs are left out


def test_length_only_groups_are_the_uniform_correctness_groups_with_reward_spread(tmp_path):
    """With soft overlong punishment, an all-wrong group can still have reward spread: its only
    signal is the length penalty. Fraction = all correct + all wrong − zero advantage."""
    run = tmp_path / "r"
    run.mkdir()
    (run / "config.yaml").write_text(json.dumps({"rollout": {"G": G}}))
    lines = [{"step": s, "all_correct_fraction": c, "all_wrong_fraction": w, "zero_adv_fraction": z}
             for s, (c, w, z) in enumerate([(0.25, 0.5, 0.5), (0.0, 0.5, 0.25)], 1)]
    (run / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert ablate.summarize_run(ablate.read_run(run), None)["length_only"] == pytest.approx((0.25 + 0.25) / 2)


def test_a_rerun_rewrites_tables_and_keeps_hand_written_findings(tmp_path, monkeypatch):
    argv, out, _ = fake_ablation(tmp_path, monkeypatch, seeds=1, rows="grpo")
    assert ablate.main(argv) == 0
    assert "**Placeholder" in out.read_text()
    first = out.read_text().split("## Findings\n")[0]
    out.write_text(first + "## Findings\n\nClip-higher never binds here.\n")
    assert ablate.main([*argv, "--report-only"]) == 0
    text = out.read_text()
    assert text.endswith("## Findings\n\nClip-higher never binds here.\n") and "**Placeholder" not in text
    assert "| naive GRPO | 0.400 |" in text  # the tables are rewritten


def test_findings_followed_by_a_stale_copy_of_the_tables_are_kept_once(tmp_path, monkeypatch):
    """A page whose hand-written findings are followed by an older report (findings written above its
    tables, then rerun): the rerun keeps the findings and drops the stale copy, placeholder included."""
    argv, out, _ = fake_ablation(tmp_path, monkeypatch, seeds=1, rows="grpo")
    assert ablate.main(argv) == 0
    report = out.read_text()
    head = report.split("## Findings\n")[0]
    out.write_text(head + "## Findings\n\nHand-written.\n\n" + report[report.index("\n## ") + 1:])  # its sections below
    assert out.read_text().count("## Findings") == 2
    assert ablate.main([*argv, "--report-only"]) == 0
    text = out.read_text()
    assert text.count("## Findings") == 1 and text.endswith("## Findings\n\nHand-written.\n")
    assert "**Placeholder" not in text


# ----------------------------------------------------------------------------- where the clip binds
def write_clip_run(path: Path, hist_high: list[float], hist_low: list[float], tokens: list[float]):
    """A fake run with the objective's clip histograms: step s has the given fractions times (s)."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(json.dumps({"rollout": {"G": G}}))
    lines = []
    for s, tok in enumerate(tokens, 1):
        row = {"step": s, "update_tokens": tok, "generated_groups": 2, "clip_frac_high": s * sum(hist_high),
               "clip_frac_low": sum(hist_low), "ratio_pos_5": 0.01 * s, "ratio_pos_6": 0.001,
               "clip_high_possible": 0.1 / s}
        row.update({f"clip_high_p_old_{k}": s * hist_high[k] for k in range(10)})
        row.update({f"clip_low_p_old_{k}": hist_low[k] for k in range(10)})
        row.update({f"ratio_pos_{k}": 0.1 for k in range(5)})
        lines.append(row)
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_clip_summary_weights_the_steps_by_their_update_tokens(tmp_path):
    high = [0.002, 0.001] + [0.0] * 7 + [0.001]  # per step s: s times these
    low = [0.0] * 8 + [0.003, 0.001]
    write_clip_run(tmp_path / "r", high, low, tokens=[100.0, 300.0])
    s = ablate.clip_summary(ablate.read_run(tmp_path / "r"))
    # upper-clipped tokens: step 1: 100·(0.002, 0.001, .., 0.001), step 2: 300·2·(...): share below 0.2 = 3/4
    assert s["high_clip_p_old_lt02"] == pytest.approx(0.75)
    assert s["high_clip_p_old_mean"] == pytest.approx((0.002 * 0.05 + 0.001 * 0.15 + 0.001 * 0.95) / 0.004)
    assert s["low_clip_p_old_lt02"] == 0.0 and s["low_clip_p_old_mean"] == pytest.approx(0.875)
    assert s["ratio_pos_between"] == pytest.approx((100 * 0.01 + 300 * 0.02) / 400)
    assert s["clip_high_possible"] == pytest.approx((100 * 0.1 + 300 * 0.05) / 400)
    assert s["clip_high_max"] == pytest.approx(0.008) and s["clip_high_end"] == pytest.approx(0.008)
    assert ablate.clip_summary({"rows": [{"step": 1, "clip_frac_high": 0.1}], "G": G}) == {}  # older runs: no histograms


def test_equal_budget_table_interpolates_accuracy_in_samples(tmp_path):
    rows, _ = ablate.define_rows(load_config(TINY).objective_config)
    by_key = {r.key: r for r in rows}
    # "token" generates 4 groups (16 responses) per step, "dapo" 8 (32): the same steps, twice the samples
    write_run(tmp_path / "token", [0.2, 0.3, 0.4], [0.5] * 4, [4, 4, 4, 4])
    write_run(tmp_path / "dapo", [0.2, 0.5, 0.6], [0.5] * 4, [8, 8, 8, 8])
    runs = {"token": [ablate.read_run(tmp_path / "token")], "dapo": [ablate.read_run(tmp_path / "dapo")]}
    table = ablate.equal_budget_table([by_key["token"], by_key["dapo"]], runs)
    lines = table.splitlines()
    assert lines[0] == "| row | acc. at 16 samples | acc. at 32 samples | acc. at 64 samples |"
    # token: evaluations at 0, 32, 64 samples (0.2, 0.3, 0.4); dapo: at 0, 64, 128 (0.2, 0.5, 0.6)
    assert lines[2] == f"| {by_key['token'].label} | 0.250 | 0.300 | 0.400 |"
    assert lines[3] == f"| {by_key['dapo'].label} | 0.275 | 0.350 | 0.500 |"
