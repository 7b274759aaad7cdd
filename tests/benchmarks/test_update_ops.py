"""benchmarks/update_ops.py: the op-kind attribution of a profiler trace accounts for the traced span,
and the script runs end to end on a small chunk."""

from __future__ import annotations


import jax
import jax.numpy as jnp
import pytest

from benchmarks import update_ops as bench_update_ops


def test_op_kinds_split_the_span():
    """Every nanosecond between the first and the last op is either idle or attributed to some op kind."""
    a = jnp.ones((256, 256))
    fn = jax.jit(lambda a: jnp.tanh(a @ a) @ a + 1.0)
    kinds, idle, span = bench_update_ops.op_kinds(fn, a, runs=3)
    assert kinds and span > 0 and idle >= 0
    assert all(v >= 0 for v in kinds.values())
    assert sum(kinds.values()) + idle == pytest.approx(span, rel=1e-6)


@pytest.mark.slow
def test_script_runs_on_a_small_chunk(capsys):
    assert bench_update_ops.main(["--size", "0.6m", "--rows", "2", "--length", "24", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "packed chunk [2, 24] forward + backward, causal blocks (1 query blocks)" in out and "GFLOP/s" in out
    assert "packed chunk [2, 24] forward + backward, one block (1 query blocks)" in out
    assert "MLP [B, S, d]" in out and "MLP [B*S, d]" in out


@pytest.mark.slow
def test_script_runs_the_main_jobs_model_in_causal_blocks(capsys):
    assert bench_update_ops.main(["--size", "cot", "--rows", "2", "--length", "192", "--repeats", "1"]) == 0
    out = capsys.readouterr().out
    assert "cot packed chunk [2, 192] forward + backward, causal blocks (3 query blocks)" in out
    assert "cot packed chunk [2, 192] forward + backward, one block (1 query blocks)" in out
