"""scripts/clip_grid.py: the grid's rows differ in the clip range alone (the random arms in their reward alone), the
random reward carries no signal, and the page's tables and tests are what the runs' metrics give."""

import json
import sys
from pathlib import Path

import numpy as np

from dapo_jax.training.config.run import load_config
from tests.conftest import load_script

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "dapo_jax" / "configs" / "tiny_dapo.yaml"

clip_grid = load_script("clip_grid")
ablate = sys.modules["ablate"]
report = sys.modules.get("clip_grid_report") or load_script("clip_grid_report")
random_reward = load_script("random_reward")
COT = REPO / "dapo_jax" / "configs" / "cot_dapo.yaml"


def test_rows_differ_in_the_clip_range_alone_and_the_random_arm_in_its_reward(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)  # the random arm's reward is named relative to the checkout
    cfg = load_config(TINY)
    plan = clip_grid.make_plan(TINY, cfg, steps=4, eval_every=2, seeds=1, runs_dir=tmp_path)
    rows = clip_grid.define_rows(cfg.objective_config)
    assert [r.key for r in rows] == ["l0.1-h0.2", "l0.1-h0.28", "l0.2-h0.2", "l0.2-h0.28", "l0.3-h0.2", "l0.3-h0.28",
                                     "random", "random-sym"]
    assert [r.key for r in rows if r.follow_up] == ["random-sym"]
    runs = {r.key: load_config(TINY, list(clip_grid.job(plan, r, 0).overrides)) for r in rows}
    ref = runs["l0.2-h0.28"].model_dump()
    # the symmetric random arm differs from the random arm in ε_high alone
    sym, rand = runs["random-sym"].model_dump(), runs["random"].model_dump()
    assert {s for s in sym if sym[s] != rand[s]} == {"objective", "train"}
    assert {k for k, v in sym["objective"].items() if v != rand["objective"][k]} == {"eps_high"}
    assert (runs["random-sym"].objective_config.eps_low, runs["random-sym"].objective_config.eps_high) == (0.2, 0.2)
    for key, run in runs.items():
        o = run.objective_config
        assert o.clip_grad_share and o.kl_beta == 0.0 and o.dynamic_sampling and o.loss_agg == "token_mean"
        assert run.optim.num_minibatches == clip_grid.off_policy_minibatches(cfg) > 1
        assert run.optim.lr == clip_grid.OFF_POLICY_LR
        row = next(r for r in rows if r.key == key)
        assert (o.eps_low, o.eps_high) == (row.eps_low, row.eps_high)
        dumped = run.model_dump()
        diff = {s for s in dumped if dumped[s] != ref[s]}
        if key == "random":
            assert diff == {"reward", "train"}  # train: its run folder
        if key.startswith("random"):
            assert [f["name"] for f in dumped["reward"]["functions"]] == ["scripts/random_reward.py:score"]
        else:
            assert diff <= {"objective", "train"}
            changed = {k for k, v in dumped["objective"].items() if v != ref["objective"][k]}
            assert changed <= {"eps_low", "eps_high"}


def test_random_reward_is_a_fair_coin_fixed_per_text():
    texts = [f"Answer: {i}" for i in range(2000)]
    scores = [random_reward.score(t, "7") for t in texts]
    assert set(scores) == {1.0, -1.0} and 900 < scores.count(1.0) < 1100
    assert [random_reward.score(t, "3") for t in texts[:50]] == scores[:50]  # the answer plays no part


def write_run(path: Path, *, acc: float, entropy: float, clip_high: float, grad_high: float):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(json.dumps({"rollout": {"G": 4}}))
    lines = [{"step": 0, "eval/accuracy": 0.2, "eval/pass@4": 0.4}]
    for s in range(1, 5):
        lines.append({"step": s, "entropy_generated": entropy, "entropy": entropy, "generated_groups": 4,
                      "response_length_mean": 10.0, "response_length_std": 1.0, "truncated_fraction": 0.0,
                      "clip_frac_low": 0.01, "clip_frac_high": clip_high, "zero_adv_fraction": 0.1, "gen_rounds": 1.0,
                      "clip_grad_share_high": grad_high, "clip_grad_share_low": 0.05})
    lines.append({"step": 4, "eval/accuracy": acc, "eval/pass@4": acc + 0.2})
    (path / "metrics.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (path / ablate.DONE_FILE).write_text(json.dumps({"steps": 4, "wall_s": [3.0]}))


def test_the_page_is_the_runs_tables_and_tests(tmp_path, monkeypatch):
    import dapo_jax.training.loop as loop

    monkeypatch.chdir(tmp_path)  # main() moves to the checkout; monkeypatch moves back

    def fake_train(cfg):  # ε_high 0.28 ends with more entropy in every seed; the gradient share is 10x the tokens'
        o, seed = cfg.objective_config, cfg.train.seed
        write_run(Path(cfg.train.run_dir), acc=0.3 + 0.01 * seed, entropy=(0.5 if o.eps_high > 0.2 else 0.3) + 0.01 * seed,
                  clip_high=0.001 * (1 + seed), grad_high=0.01 * (1 + seed))
        return {}

    monkeypatch.setattr(loop, "train", fake_train)
    out = tmp_path / "clip_grid.md"
    argv = [str(TINY), "--steps", "4", "--eval-every", "2", "--seeds", "3", "--out", str(out),
            "--runs-dir", str(tmp_path / "runs"), "--no-compile-cache", "--jobs", "1"]
    assert clip_grid.main(argv) == 0
    text = out.read_text()
    assert "## Findings" in text and "Placeholder" in text
    line = next(x for x in text.splitlines() if x.startswith("| ε_high 0.28 vs 0.2 at ε_low 0.2 |")
                and "H gen. end" in x)
    cells = [c.strip() for c in line.split("|")]
    assert cells[4:6] == ["0.5100", "0.3100"] and cells[6].startswith("+0.2000")  # seeds 0-2: 0.50, 0.51, 0.52
    # the gradient share against the token share, paired within each row's runs
    paired = next(x for x in text.splitlines() if x.startswith("| high clip: gradient vs token share | `l0.1-h0.2` |"))
    cells = [c.strip() for c in paired.split("|")]
    assert cells[4:6] == ["0.0200", "0.0020"] and cells[6].startswith("+0.0180")
    first, _, later = text.partition("The follow-up family")
    tests = lambda t: [x for x in t.splitlines() if x.startswith("| ") and ("separable" in x or "no test" in x)]
    # 3 clip-higher pairs and 4 ε_low pairs x 4 metrics, the random arm x 3, 7 rows x 2 sides: as before the
    # follow-up row, whose tests (against its task row and against the random arm, x 3; its 2 sides) are corrected
    # among themselves
    assert len(tests(first)) == 3 * 4 + 4 * 4 + 3 + 14
    assert len(tests(later)) == 3 + 3 + 2 and "`random-sym`" in later.splitlines()[0]
    line = next(x for x in tests(later) if x.startswith("| ε_high 0.28 vs 0.2, random reward | `random` → `random-sym`")
                and "H gen. end" in x)
    cells = [c.strip() for c in line.split("|")]
    assert cells[4:6] == ["0.5100", "0.3100"] and cells[6].startswith("+0.2000")
    assert (tmp_path / "figures" / "clip_grid_fig2.png").exists()
    assert "`scripts/random_reward.py`" in text


def test_the_regime_is_dapo_with_16_minibatches_at_its_lr():
    cfg = load_config(COT)
    plan = clip_grid.make_plan(COT, cfg, steps=7, eval_every=2, seeds=3, runs_dir=Path("/tmp/unused"))
    rows = clip_grid.define_rows(cfg.objective_config)
    dapo = load_config(COT, list(clip_grid.job(plan, rows[3], 0).overrides))  # l0.2-h0.28: CONFIG's own objective
    assert dapo.objective_config.model_copy(update={"clip_grad_share": False}) == cfg.objective_config
    assert dapo.optim.num_minibatches == 16 and dapo.rollout.gen_batch == dapo.rollout.train_batch == 16
    # as many mini-batches as the batch allows, up to 16
    assert clip_grid.off_policy_minibatches(load_config(COT, ["rollout.train_batch=12", "rollout.gen_batch=12"])) == 12
    assert clip_grid.off_policy_minibatches(load_config(COT, ["rollout.train_batch=24", "rollout.gen_batch=24"])) == 12
    other = clip_grid.make_plan(COT, cfg, steps=7, eval_every=2, seeds=1, runs_dir=Path("/tmp/unused"), lr=3e-5)
    assert load_config(COT, list(clip_grid.job(other, rows[0], 0).overrides)).optim.lr == 3e-5


def test_fig3_counts_each_seeds_clipped_tokens_by_their_p_old(tmp_path):
    from tests.scripts.test_ablate import write_clip_run

    high = [0.002, 0.001] + [0.0] * 7 + [0.001]  # per step s: s times these
    write_clip_run(tmp_path / "r", high, [0.0] * 8 + [0.003, 0.001], tokens=[100.0, 300.0])
    counts = report.clip_histograms([ablate.read_run(tmp_path / "r")])
    np.testing.assert_allclose(counts["high"][0], 100 * np.array(high) + 600 * np.array(high))
    np.testing.assert_allclose(counts["pos"][0][:5], [40.0] * 5)
    rows = clip_grid.define_rows(load_config(COT).objective_config)
    path = report.write_fig3(tmp_path / "fig3.png", rows, {"l0.2-h0.28": [ablate.read_run(tmp_path / "r")]})
    assert path is not None and path.stat().st_size > 0
    assert report.write_fig3(tmp_path / "none.png", rows, {}) is None
