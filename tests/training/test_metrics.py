"""metrics.jsonl: one flushed JSON line per write, TensorBoard scalars, resumed steps deduplicated, compile counter."""

import json

import jax
import jax.numpy as jnp
import numpy as np

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
