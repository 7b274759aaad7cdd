"""scripts/stage_compare.py: the chains it writes are valid stages files with the per-seed knobs, and its
report's means, sds and tests match a NumPy / by-hand reference on hand-built chain metrics."""

import gzip
import json
import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from dapo_jax.training.stages import load_stages
from tests.conftest import load_script

sc = load_script("stage_compare")
REPO = Path(__file__).resolve().parents[2]


def plan(out, seeds=(0, 1, 2)):
    return sc.Plan(out, seeds, budget=512, sft_examples=40, sft_steps=3, rft_limit=16, rft_k=4, rft_steps=2,
                   teacher_seed=seeds[0], eval_size=16)


def test_every_chain_is_a_valid_stages_file_with_the_seed_and_budget(tmp_path):
    p = plan(tmp_path / "out")
    p.teacher.parent.mkdir(parents=True)
    p.teacher.symlink_to(REPO / "dapo_jax" / "assets" / "cot_base")  # the dapo arm's export, once it exists
    for arm in sc.ARMS:
        spec = tmp_path / f"{arm}.yaml"
        spec.write_text(yaml.safe_dump(sc.stages(p, arm, 2)))
        plans = load_stages(spec)
        for sp in plans:
            cfg = sp.cfg
            assert (cfg.train.seed, cfg.data.order_seed, cfg.data.seed) == (2, 2, 0)  # data.seed: the problems
            assert cfg.data.eval_size == 16 and cfg.train.run_dir == str(p.run(arm, 2) / f"{sp.index}-{sp.stage.name}")
            if not cfg.objective_config.supervised:
                assert cfg.train.max_samples == 512 and cfg.train.steps == 4  # 512 / (16 x 8) rounds at most
        names = [sp.stage.name for sp in plans]
        assert names == {"dapo": ["dapo", "rft"], "cold_start": ["cold_start", "dapo"], "distill": ["distill"]}[arm]
    cold = load_stages(tmp_path / "cold_start.yaml")[0].cfg
    assert (cold.data.train.limit, cold.train.steps, cold.data.train.options["variant"]) == (40, 3, "reference")
    distill = load_stages(tmp_path / "distill.yaml")[0].cfg
    assert distill.distill.teacher == str(p.teacher) and distill.distill.task_weight == 0
    assert not distill.objective_config.dynamic_sampling and distill.model.path.endswith("cot_base")
    rft = load_stages(tmp_path / "dapo.yaml")[1]
    assert (rft.stage.rft.k, rft.stage.rft.limit, rft.cfg.train.steps) == (4, 16, 2)


def write_chain(run: Path, stages: list[tuple[str, float, float, int]], gz=False):
    """A chain's RUN/metrics.jsonl as training/stages.py:combine_metrics writes it: per stage (name, avg@4 at its
    start, at its end, training steps), 16 generated groups a step in RL stages (none in SFT ones)."""
    lines, offset = [], 0
    for i, (name, first, last, steps) in enumerate(stages):
        (run / f"{i}-{name}").mkdir(parents=True)
        (run / f"{i}-{name}" / "config.yaml").write_text(yaml.safe_dump({"rollout": {"G": 8}}))
        for s in range(steps + 1):
            row = {"step": offset + s, "stage": name, "stage_index": i, "stage_step": s}
            if s and name not in ("cold_start", "rft"):
                row["generated_groups"] = 16
            if s in (0, steps):
                row.update({"eval/accuracy": first if s == 0 else last, "eval/pass@4": min(1.0, 2 * (first if s == 0
                                                                                                 else last))})
            lines.append(json.dumps(row))
        offset += steps
    text = "\n".join(lines) + '\n{"step": 99, "sta'  # a torn last line, as a killed process leaves
    run.mkdir(parents=True, exist_ok=True)
    if gz:
        (run / "metrics.jsonl.gz").write_bytes(gzip.compress(text.encode()))
    else:
        (run / "metrics.jsonl").write_text(text)


DAPO_END = {0: 0.30, 1: 0.34, 2: 0.29}
RFT_END = {0: 0.33, 1: 0.35, 2: 0.33}
COLD_END = {0: 0.40, 1: 0.36, 2: 0.41}
DISTILL_END = {0: 0.31, 1: 0.27, 2: 0.33}


@pytest.fixture
def chains(tmp_path):
    out = tmp_path / "chains"
    for s in (0, 1, 2):
        write_chain(out / "dapo" / f"seed{s}", [("dapo", 0.23, DAPO_END[s], 3), ("rft", DAPO_END[s], RFT_END[s], 2)],
                    gz=s == 1)
        write_chain(out / "cold_start" / f"seed{s}", [("cold_start", 0.23, 0.35, 2), ("dapo", 0.35, COLD_END[s], 3)])
        if s != 2:  # seed 2's distillation never finished a stage: left out of its rows
            write_chain(out / "distill" / f"seed{s}", [("distill", 0.23, DISTILL_END[s], 4)])
    return out


def welch_p(a, b):
    """Welch's t and the Welch-Satterthwaite degrees of freedom, by hand."""
    a, b = np.asarray(a), np.asarray(b)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    return 2 * stats.t.sf(abs(t), df)


def test_a_stage_boundary_keeps_both_stages_rows(chains):
    """The last step of `dapo` and the first evaluation of `rft` share a chain step: both stay."""
    ev = sc.stage_evals(chains / "dapo" / "seed0")
    assert ev["dapo"]["last"]["eval/accuracy"] == 0.30 and ev["rft"]["first"]["eval/accuracy"] == 0.30
    assert ev["dapo"]["samples"] == 3 * 16 * 8 and ev["rft"]["samples"] == 0 and ev["rft"]["last"]["step"] == 5


def test_the_report_is_the_reference_statistics(chains):
    text = sc.report(chains, (0, 1, 2))
    row = {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines()}

    def mean_sd(d):
        v = np.array(list(d.values()))
        return f"{v.mean():.3f} ± {v.std(ddof=1):.3f}"

    assert row["DAPO alone"].startswith(f"| DAPO alone | {mean_sd(DAPO_END)} |")
    assert "| 0.300 | 0.340 | 0.290 | 384 ± 0 |" in row["DAPO alone"]
    assert row["cold-start SFT + DAPO"].startswith(f"| cold-start SFT + DAPO | {mean_sd(COLD_END)} |")
    assert row["cold-start SFT (before DAPO)"].endswith("| 0.350 | 0.350 | 0.350 | 0 ± 0 |")
    assert row["DAPO + RFT"].endswith("| 0.330 | 0.350 | 0.330 | 384 ± 0 |")  # the rft stage samples nothing more
    assert row["distillation from a DAPO model"].endswith("| 0.310 | 0.270 | – | 512 ± 0 |")
    assert row["base (cot_base, step 0)"].startswith("| base (cot_base, step 0) | 0.230 ± 0.000 |")

    a = [COLD_END[s] for s in (0, 1, 2)], [DAPO_END[s] for s in (0, 1, 2)]
    b = [DISTILL_END[s] for s in (0, 1)], a[1]
    d = np.array([RFT_END[s] - DAPO_END[s] for s in (0, 1, 2)])
    e = np.array([COLD_END[s] - 0.35 for s in (0, 1, 2)])  # against the chain's own SFT stage

    def paired_p(x):  # the paired t by hand
        return 2 * stats.t.sf(abs(x.mean() / (x.std(ddof=1) / math.sqrt(len(x)))), len(x) - 1)

    ps = [welch_p(*a), welch_p(*b), paired_p(d), paired_p(e)]
    order = np.argsort(ps)  # Holm by hand: (m - rank) p, running max, capped at 1
    adjusted, running = [0.0] * 4, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (4 - rank) * ps[i]))
        adjusted[i] = running
    tests = [line for line in text.splitlines() if line.startswith(("| A:", "| B:", "| C:", "| D:"))]
    assert len(tests) == 4
    for line, delta, p, p_adj, kind, n in zip(
            tests, (np.mean(a[0]) - np.mean(a[1]), np.mean(b[0]) - np.mean(b[1]), d.mean(), e.mean()), ps, adjusted,
            ("Welch", "Welch", "paired t", "paired t"), ("3 vs 3", "2 vs 3", "3 vs 3", "3 vs 3")):
        cells = line.split(" | ")
        assert cells[1] == kind and cells[2] == n
        assert cells[3].startswith(f"{delta:+.3f} [")
        shown = cells[3].split(" p")[1].split()[0]
        assert shown == (f"={p:.3f}" if p < 0.01 else f"={p:.2f}"), (line, p)
        assert cells[4] == f"{p_adj:.3f}"
        assert cells[5].rstrip(" |") == ("separable" if p_adj < 0.05 else "not separable")


def test_a_missing_arm_is_too_few_runs(tmp_path):
    out = tmp_path / "chains"
    write_chain(out / "dapo" / "seed0", [("dapo", 0.2, 0.3, 2), ("rft", 0.3, 0.31, 1)])
    text = sc.report(out, (0, 1))
    assert "| DAPO alone | 0.300 | 0.600 | 0.300 | – | 256 |" in text
    assert text.count("too few finished runs") == 4


def test_a_chain_is_finished_when_every_stage_is_exported(tmp_path):
    run = tmp_path / "dapo" / "seed0"
    assert not sc.is_finished(run)
    run.mkdir(parents=True)
    (run / "stages.yaml").write_text(yaml.safe_dump({"stages": [{"name": "dapo"}, {"name": "rft"}]}))
    (run / "0-dapo" / "model").mkdir(parents=True)
    assert not sc.is_finished(run)
    (run / "1-rft" / "model").mkdir(parents=True)
    assert sc.is_finished(run)
