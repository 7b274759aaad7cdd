"""Rollout logs: a sample of each logged step's groups with rewards, kept/trained flags and the
advantages the update used; written at the first step and every N steps, by process 0 only, without
compiling anything after the first step."""

import json

import numpy as np
import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.training.rollout import Groups, collect_groups
from dapo_jax.training.rollout_log import RolloutLog, read_rollouts, rollout_steps

TOK = build_char_tokenizer()


def fake_groups(n, *, g=2, t=4, correct=None, seed=0):
    rng = np.random.default_rng(seed)
    ids = np.array([TOK.encode(f"{i}+1=", add_special_tokens=False) for i in range(10, 10 + n)], np.int32)
    resp = rng.integers(3, 20, size=(n, g, t)).astype(np.int32)
    correct = np.asarray(correct if correct is not None else rng.random((n, g)) < 0.5)
    return Groups(ids, np.ones_like(ids), resp, np.ones((n, g, t), np.float32), np.zeros((n, g, t), np.float32),
                  np.where(correct, 1.0, -1.0).astype(np.float32), correct, np.full((n, g), t, np.int32),
                  np.zeros((n, g), bool), np.ones(n, bool), np.zeros(n, np.int32))


def test_kept_trained_and_advantages_map_to_the_right_groups(tmp_path):
    # Round 0: groups 0 and 2 have spread (kept); round 1: groups 0, 1 kept. One carried group goes first,
    # so the batch of 4 is [carried, r0g0, r0g2, r1g0] and r1g1 is surplus (kept, not trained).
    rounds = [fake_groups(3, correct=[[1, 0], [1, 1], [0, 1]]), fake_groups(3, correct=[[0, 1], [1, 0], [0, 0]])]
    carry = fake_groups(1, correct=[[1, 0]])
    log = RolloutLog(tmp_path, every=5, sample=5, tokenizer=TOK)
    keep = lambda g: g.correct.any(1) & ~g.correct.all(1)  # noqa: E731
    sample, keep_fn = log.watch(5, lambda i: rounds[i], keep)
    batch, _, _ = collect_groups(sample, keep_fn, train_batch=4, max_gen_batches=2, carry=carry)
    adv = np.arange(4 * 2, dtype=np.float32).reshape(4, 2)[..., None] * batch.response_mask  # [P, G, T]
    path = log.write(5, batch, adv)
    assert path == tmp_path / "rollouts" / "5.jsonl"
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(d["round"], d["group"], d["kept"], d["trained"]) for d in lines] == [
        (0, 0, True, True), (0, 1, False, False), (0, 2, True, True), (1, 0, True, True), (1, 1, True, False)]
    assert [r["advantage"] for r in lines[0]["responses"]] == [2.0, 3.0]  # batch row 1
    assert [r["advantage"] for r in lines[2]["responses"]] == [4.0, 5.0]  # batch row 2
    assert [r["advantage"] for r in lines[3]["responses"]] == [6.0, 7.0]  # batch row 3
    assert all(r["advantage"] is None for d in (lines[1], lines[4]) for r in d["responses"])
    first = lines[0]
    assert first["prompt"] == "10+1=" and first["step"] == 5
    assert first["responses"][0]["correct"] and first["responses"][0]["reward"] == 1.0
    assert first["responses"][0]["text"] == TOK.decode(rounds[0].response_ids[0, 0].tolist())


def test_written_at_the_first_step_then_every_n_and_only_by_the_writer(tmp_path):
    g = fake_groups(2)
    log = RolloutLog(tmp_path / "a", every=3, sample=4, tokenizer=TOK)
    for step in (7, 8, 9):  # a resumed run: its first step is logged, then multiples of 3
        sample, _ = log.watch(step, lambda i: g, None)
        batch, _, _ = collect_groups(sample, None, train_batch=2, max_gen_batches=1)
        log.write(step, batch, None)
    assert rollout_steps(tmp_path / "a") == [7, 9]
    step, lines = read_rollouts(tmp_path / "a")
    assert step == 9 and len(lines) == 2 and all(d["kept"] and d["trained"] for d in lines)
    assert all(r["advantage"] is None for d in lines for r in d["responses"])  # no update: no advantages
    quiet = RolloutLog(tmp_path / "b", every=1, sample=4, tokenizer=TOK, enabled=False)  # processes other than 0
    sample, _ = quiet.watch(1, lambda i: g, None)
    quiet.write(1, collect_groups(sample, None, train_batch=2, max_gen_batches=1)[0], None)
    never = RolloutLog(tmp_path / "c", every=0, sample=4, tokenizer=TOK)
    assert not never.active(1) and not (tmp_path / "b").exists()


def test_read_errors_say_what_exists(tmp_path):
    with pytest.raises(FileNotFoundError, match="no rollouts logged"):
        read_rollouts(tmp_path)
    (tmp_path / "rollouts").mkdir()
    (tmp_path / "rollouts" / "4.jsonl").write_text("{}\n")
    with pytest.raises(FileNotFoundError, match=r"logged steps: \[4\]"):
        read_rollouts(tmp_path, 3)


def test_a_real_run_logs_consistent_groups_and_compiles_nothing_after_step_1(tiny_dapo_run):
    run_dir, _ = tiny_dapo_run
    assert rollout_steps(run_dir) == [1, 2]
    _, lines = read_rollouts(run_dir, 2)
    assert len(lines) == 6
    for d in lines:
        rewards = np.array([r["reward"] for r in d["responses"]])
        assert all((r["reward"] > 0) == r["correct"] for r in d["responses"])
        if d["trained"]:  # GRPO advantages: zero-sum in a group, same order as the rewards
            adv = np.array([r["advantage"] for r in d["responses"]])
            assert abs(adv.sum()) < 1e-4 and (np.sign(adv) == np.sign(rewards - rewards.mean())).all()
        if not d["kept"]:  # dynamic sampling drops the groups without spread
            assert len(set(r["correct"] for r in d["responses"])) == 1
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    counts = [r["compilations"] for r in rows if "grad_norm" in r]
    assert counts == [counts[0]] * len(counts)


def test_a_mixture_s_groups_name_their_source_and_show_prints_it(tmp_path):
    import io

    from dapo_jax.show import show_rollouts

    g = fake_groups(3)
    g.source = np.array([1, 0, 1], np.int32)
    log = RolloutLog(tmp_path, every=1, sample=4, tokenizer=TOK, sources=("math", "code"))
    sample, _ = log.watch(1, lambda i: g, None)
    batch, _, _ = collect_groups(sample, None, train_batch=3, max_gen_batches=1)
    log.write(1, batch, None)
    _, lines = read_rollouts(tmp_path)
    assert [d["source"] for d in lines] == ["code", "math", "code"]
    out = io.StringIO()
    show_rollouts(tmp_path, file=out, plain=True)
    assert "round 0 group 0 (code):" in out.getvalue() and "round 0 group 1 (math):" in out.getvalue()
    alone = RolloutLog(tmp_path / "one", every=1, sample=4, tokenizer=TOK)  # no mixture: no source key
    sample, _ = alone.watch(1, lambda i: g, None)
    alone.write(1, collect_groups(sample, None, train_batch=3, max_gen_batches=1)[0], None)
    assert all("source" not in d for d in read_rollouts(tmp_path / "one")[1])
