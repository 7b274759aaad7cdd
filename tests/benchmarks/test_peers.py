"""benchmarks/peers.py: our side of `--quick` runs and prints sane figures; the peers' ratios come
from the figures; the peers themselves only where installed (`pip install -e .[bench]`)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from benchmarks import peers as bench_peers
from benchmarks.workload import QUICK, parse_result, summarize


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.jsonl"
    assert bench_peers.main(["--quick", "--no-peers", "--json", str(out)]) == 0
    return [json.loads(line) for line in out.read_text().splitlines()]


@pytest.mark.slow
def test_quick_ours_figures_are_sane(quick, capsys):
    (r,) = quick  # --quick runs one dapo_jax variant and no peer
    assert r["framework"].startswith("dapo_jax")
    w = QUICK
    assert r["num_responses"] == w.prompts * w.G * w.timed_steps
    assert 1 <= r["min_length"] <= r["mean_length"] <= r["max_length"] <= w.max_new_tokens
    # geometric lengths with mean 6 (sd ~5.5) over 32 responses: the EOS weight's calibration holds
    assert 3.0 <= r["mean_length"] <= 10.0, r["mean_length"]
    assert r["step_s"] > 0 and r["generate_s"] > 0 and r["update_s"] > 0
    assert r["host_s"] >= -1e-3
    assert len(r["step_s_all"]) == w.steps
    timed = r["step_s_all"][w.warmup_steps:]  # rounded to 0.1 ms; the median of 2 is their mean
    assert r["step_s"] == pytest.approx(sum(timed) / 2, abs=1e-3)
    assert 0 < r["update_peak_fraction"] < 1.5  # FLOPs counted on the right scale (not 100x off)
    assert r["update_flops_per_s"] == pytest.approx(r["update_peak_fraction"] * r["peak_flops_per_s"])
    # the peak a run is measured against: the mean of those taken just before and after it
    assert r["peak_before"] > 1e9 and r["peak_after"] > 1e9
    assert r["peak_flops_per_s"] == pytest.approx((r["peak_before"] + r["peak_after"]) / 2)
    assert 0 < r["packed_token_fraction"] <= 1  # shared prompts: the packed rows hold at most every token
    assert r["compilations_after_step1"] == 0  # fixed shapes: nothing compiles after the first step
    assert r["params"] == pytest.approx(6.2e5, rel=0.05)
    # the table's last column: the first step, compilation included (longer than a warm one)
    assert bench_peers.fmt_row(r, r["step_s"]).split()[-1] == f"{r['step_s_all'][0]:.2f}"
    assert r["step_s_all"][0] > r["step_s"]


def test_ratios_are_computed_from_the_figures():
    results = [{"framework": "dapo_jax", "step_s": 2.0}, {"framework": "dapo_jax +compaction", "step_s": 1.0},
               {"framework": "TRL", "step_s": 7.0}, {"framework": "Tunix", "error": "not installed"}]
    assert bench_peers.add_ratios(results) == 1.0
    assert results[2]["ratio_to_ours"] == 7.0 and results[2]["ours_reference"] == "dapo_jax +compaction"
    assert "ratio_to_ours" not in results[3] and "ratio_to_ours" not in results[0]
    line = bench_peers.fmt_row(results[3], 1.0)
    assert "NOT RUN" in line and "not installed" in line


def test_summary_and_flop_count():
    s = summarize([9.0, 3.0, 1.0, 2.0], [5.0, 1.0, 0.5, 1.0], [3.0, 1.5, 0.25, 0.5], [[1], [2], [3], [4, 5]],
                  warmup=1)
    assert s["step_s"] == 2.0 and s["generate_s"] == 1.0 and s["update_s"] == 0.5 and s["host_s"] == 0.5
    assert s["mean_length"] == 3.5 and s["num_responses"] == 4 and s["max_length"] == 5
    info = {"matmul_params": 10, "layers": 2, "attn_dim": 3}
    assert bench_peers.update_flops(info, [2, 4]) == 6 * 10 * 6 + 6 * 2 * 3 * (4 + 16)
    assert parse_result("noise\nBENCH_JSON {\"a\": 1}\n") == {"a": 1}


def test_missing_peer_is_reported_not_fatal():
    r = bench_peers.run_peer("trl", "", Path("."), QUICK, "0.6m", 10)
    assert "error" in r and "--trl-python" in r["error"]
    r = bench_peers.run_peer("tunix", "/bin/false", Path("."), QUICK, "0.6m", 10)  # a peer that fails
    assert "error" in r and r["error"].startswith("exit 1")


@pytest.mark.slow
@pytest.mark.parametrize("peer", ["trl", "tunix"])
def test_peer_quick(peer, tmp_path):
    """The peer's runner on the quick workload, where the peer is installed in this interpreter."""
    if importlib.util.find_spec(peer) is None:
        pytest.skip(f"{peer} is not installed here (optional extra: pip install -e .[bench])")
    info = bench_peers.build_model("0.6m", QUICK, tmp_path)
    r = bench_peers.run_peer(peer, sys.executable, tmp_path, QUICK, "0.6m", 900)
    assert "error" not in r, r.get("error")
    assert 1 <= r["mean_length"] <= QUICK.max_new_tokens
    assert r["num_responses"] == QUICK.prompts * QUICK.G * QUICK.timed_steps
    assert bench_peers.flops_rate(info, r["seq_lengths_per_step"], r["update_s_all"]) > 0
