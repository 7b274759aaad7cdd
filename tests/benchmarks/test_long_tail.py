"""benchmarks/long_tail.py runs end to end on a few cot prompts: generate with and without
compaction (outputs checked identical inside the script) and the continuous stream beside them."""

from __future__ import annotations


import pytest

from benchmarks import long_tail as bench_long_tail


@pytest.mark.slow
def test_script_runs_on_a_few_cot_prompts(capsys):
    bench_long_tail.main(["--setups", "cot", "--cot-prompts", "4", "--repeats", "1", "--stream-rounds", "2",
                          "--refill", "2", "--min-rows", "4"])
    out = capsys.readouterr().out
    assert "cot rows   32 T  144" in out and "compacted" in out
    assert "2 x 4 prompts, 4 slots refilled 2 at a time" in out and "continuous / plain" in out
    assert "decode calls" in out
