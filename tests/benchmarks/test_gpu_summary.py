"""benchmarks/gpu_summary.py: floors, gaps and goals of hand-made rows against hand-computed figures."""

from __future__ import annotations

import json

import pytest

from benchmarks import gpu_summary

PEAKS = dict(phase="peaks", device="NVIDIA H100 80GB HBM3", jax="0.11.2", matmul_peak_flops_per_s=1e12,
             copy_bytes_per_s=1e11)


def decode_row(sequences, step_ms, step_bytes, step_flops, new_tokens=512):
    return dict(phase=f"decode_{new_tokens}", model="0.5b", sequences=sequences, new_tokens=new_tokens,
                step_ms=step_ms, tokens_per_s=sequences / (step_ms / 1e3), step_bytes=step_bytes,
                step_flops=step_flops, compile_s=20.0, peak_memory_bytes=2 * 2**30)


def test_decode_floors_by_hand():
    # bytes 1e9 over 1e11 B/s = 10 ms; FLOPs 5e9 over 1e12 FLOP/s = 5 ms: bound by bandwidth
    f = gpu_summary.decode_floors(decode_row(16, 15.0, 1e9, 5e9), 1e12, 1e11)
    assert f["bandwidth_floor_ms"] == pytest.approx(10.0) and f["compute_floor_ms"] == pytest.approx(5.0)
    assert f["floor_ms"] == pytest.approx(10.0) and f["gap"] == pytest.approx(1.5)
    # 16 sequences per 5 ms at the peak = 3,200 tokens/s; the row decodes 16 / 15 ms = 1,066.7
    assert f["peak_tokens_per_s"] == pytest.approx(3200.0)
    assert f["fraction_of_peak_tokens"] == pytest.approx((16 / 0.015) / 3200.0)
    # FLOPs 4e10 = 40 ms over bytes 2e9 = 20 ms: bound by compute
    g = gpu_summary.decode_floors(decode_row(1024, 100.0, 2e9, 4e10), 1e12, 1e11)
    assert g["floor_ms"] == pytest.approx(40.0) and g["gap"] == pytest.approx(2.5)
    assert g["fraction_of_peak_tokens"] == pytest.approx(0.4)  # 10,240 of 25,600 tokens/s


def test_summary_checks_the_goals_and_lists_failures(tmp_path):
    rows = [PEAKS, decode_row(16, 15.0, 1e9, 5e9), decode_row(1024, 100.0, 2e9, 4e10),
            dict(phase="train", model="0.5b", step_s=0.5, sequences=128, laid_out_tokens=40000, flops_per_s=4.5e14,
                 mfu=0.45, fraction_of_measured_peak=0.6, peak_memory_bytes=2**30),
            dict(phase="train", model="1.5b", step_s=2.0, sequences=128, laid_out_tokens=40000, flops_per_s=2e14,
                 mfu=0.2, fraction_of_measured_peak=0.3, peak_memory_bytes=2**30),
            dict(phase="decode_4096", model="0.5b", sequences=256, error="timed out after 90 s")]
    path = tmp_path / "device.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"phase\": \"trunc")  # a killed writer's last line
    text = gpu_summary.summarize(gpu_summary.load(path))
    assert "| 16 | 512 | 1,067 | 15.000 | 10.000 | 5.000 | 1.5x | 33.3% |" in text
    assert "| 1024 | 512 | 10,240 | 100.000 | 20.000 | 40.000 | 2.5x | 40.0% |" in text
    assert "decode 16 x 512: step 15.000 ms, 1.5x its bandwidth floor (goal 2x): met" in text
    assert "decode 1024 x 512: 40.0% of the peak tokens/s (goal 50%): not met" in text
    assert "update 0.5b: MFU 45.0% (goal 40%): met" in text and "update 1.5b: MFU 20.0% (goal 40%): not met" in text
    assert "decode_4096 (256 sequences, 0.5b): timed out after 90 s" in text


def test_without_peaks_the_decode_rows_have_no_floor():
    text = gpu_summary.summarize([decode_row(16, 15.0, 1e9, 5e9)])
    assert text.startswith("No `peaks` row") and "step / floor" not in text


def test_a_missing_file_is_one_line_and_exit_2(tmp_path, capsys):
    assert gpu_summary.main([str(tmp_path / "absent.jsonl")]) == 2
    assert capsys.readouterr().err.strip() == f"benchmarks.gpu_summary: {tmp_path / 'absent.jsonl'}: no such file"
