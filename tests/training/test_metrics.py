"""metrics.jsonl: one flushed JSON line per write, TensorBoard scalars, resumed steps deduplicated, compile counter."""

import json
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.training.metrics import MetricsWriter, compile_count, read_metrics


def test_rows_are_flushed_immediately_and_plain_json(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=True)
    w.write(1, {"reward_mean": np.float32(0.5), "gen_rounds": np.int64(2), "nan": float("nan"), "ok": np.bool_(True)})
    # Readable before close: a SIGKILL right now loses nothing already written.
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row == {"step": 1, "reward_mean": 0.5, "gen_rounds": 2, "nan": None, "ok": True}
    w.close()
    assert any((tmp_path / "tensorboard").iterdir())


def test_read_metrics_merges_and_keeps_last_of_a_redone_step(tmp_path):
    lines = [{"step": 0, "eval/accuracy": 0.1}, {"step": 1, "reward_mean": 0.1}, {"step": 2, "reward_mean": 0.2},
             {"step": 2, "reward_mean": 0.25}, {"step": 2, "eval/accuracy": 0.3}]
    (tmp_path / "metrics.jsonl").write_text("\n".join(map(json.dumps, lines)) + '\n{"step": 3, "rew')
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2]
    assert rows[2] == {"step": 2, "reward_mean": 0.25, "eval/accuracy": 0.3}


def test_a_chains_stage_boundary_keeps_each_stages_row(tmp_path):
    # training/stages.py counts `step` over the chain: stage 0 ends at step 2, stage 1's step-0 evaluation
    # is step 2 as well. Merged by step alone, stage 0's last training row was labelled stage 1.
    a = {"stage": "sft", "stage_index": 0}
    b = {"stage": "dapo", "stage_index": 1}
    lines = [{"step": 0, "stage_step": 0, "eval/accuracy": 0.1, **a}, {"step": 2, "stage_step": 2, "loss": 0.5, **a},
             {"step": 2, "stage_step": 2, "eval/accuracy": 0.4, **a}, {"step": 2, "stage_step": 0, "eval/accuracy": 0.4, **b},
             {"step": 3, "stage_step": 1, "reward_mean": 0.6, **b}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    rows = read_metrics(tmp_path)
    assert [(r["stage"], r["step"], r["stage_step"]) for r in rows] == [
        ("sft", 0, 0), ("sft", 2, 2), ("dapo", 2, 0), ("dapo", 3, 1)]
    assert rows[1] == {"step": 2, "stage_step": 2, "loss": 0.5, "eval/accuracy": 0.4, **a}


def test_compile_count_counts_new_compilations_only():
    f = jax.jit(lambda x: jnp.sin(x) * 3.0 + 1.0)
    x7, y7, x8 = np.ones(7, np.float32), np.full(7, 2.0, np.float32), np.ones(8, np.float32)
    before = compile_count()
    f(x7)
    after_first = compile_count()
    f(y7)
    assert after_first > before and compile_count() == after_first
    f(x8)  # a new shape compiles again
    assert compile_count() > after_first


def test_disabled_writer_writes_nothing(tmp_path):
    from dapo_jax.training.metrics import MetricsWriter

    writer = MetricsWriter(tmp_path / "run", tensorboard=True, enabled=False)  # processes other than 0
    row = writer.write(3, {"loss": 1.5})
    writer.close()
    assert row == {"step": 3, "loss": 1.5}
    assert not (tmp_path / "run").exists()


def test_a_torn_last_line_is_set_aside_and_the_next_row_is_kept(tmp_path):
    """Power lost mid-write: metrics.jsonl ends in half a row. Appending to it would glue the next row onto
    the fragment and lose it; the writer cuts the fragment (kept aside) first, with a warning."""
    whole = [json.dumps({"step": s, "loss": 0.5 * s}) for s in (1, 2)]
    text = "\n".join(whole) + "\n" + json.dumps({"step": 3, "loss": 1.5})
    torn = text[: len(text) - 7]  # step 3's row cut 7 bytes before its end
    (tmp_path / "metrics.jsonl").write_text(torn)
    with pytest.warns(RuntimeWarning, match="torn line"):
        w = MetricsWriter(tmp_path, tensorboard=False)
    w.write(3, {"loss": 1.5})
    w.close()
    assert (tmp_path / "metrics.jsonl").read_text() == "\n".join(whole) + "\n" + '{"step": 3, "loss": 1.5}\n'
    [aside] = tmp_path.glob("metrics.jsonl.torn-*")
    assert aside.read_text() == torn[len("\n".join(whole)) + 1:]
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2, 3]


def test_a_whole_last_row_without_its_newline_is_kept(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "loss": 0.5}')  # killed between the row and "\n"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        w = MetricsWriter(tmp_path, tensorboard=False)
    w.write(2, {"loss": 1.0})
    w.close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]
    assert not list(tmp_path.glob("metrics.jsonl.torn-*"))


def test_a_torn_line_longer_than_a_read_block_and_a_file_of_one_fragment(tmp_path):
    long_row = json.dumps({"step": 1, "text": "x" * 200_000})
    (tmp_path / "metrics.jsonl").write_text(long_row[:150_000])  # no newline at all
    with pytest.warns(RuntimeWarning, match="150000 bytes"):
        MetricsWriter(tmp_path, tensorboard=False).close()
    assert (tmp_path / "metrics.jsonl").read_text() == ""
    [aside] = tmp_path.glob("metrics.jsonl.torn-*")
    assert aside.read_text() == long_row[:150_000]


def test_a_missing_metrics_file_on_resume_is_warned_of(tmp_path):
    with pytest.warns(RuntimeWarning, match="missing although the run resumes from step 4"):
        MetricsWriter(tmp_path, tensorboard=False, resumed_from=4).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        MetricsWriter(tmp_path / "new", tensorboard=False, resumed_from=0).close()
