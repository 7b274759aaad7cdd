"""benchmarks/device.py: the FLOP count against a hand count, the device peak table, and a `--quick` run
of a train and a decode phase (each in its own process) whose figures agree with their own inputs."""

from __future__ import annotations

import dataclasses
import json

import pytest

from benchmarks import device as bench_device


def test_the_model_is_qwen25_05b_shaped():
    cfg = bench_device.model_config(quick=False)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (896, 4864, 24)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim, cfg.vocab_size) == (14, 2, 64, 151936)
    assert cfg.tie_word_embeddings and cfg.dtype == "bfloat16" and cfg.param_dtype == "float32"
    assert cfg.remat == "dots_saveable"


def test_train_flops_by_hand():
    cfg = bench_device.model_config(quick=True)  # hidden 64, 2 layers, 4 heads x 16, vocab 512, tied
    assert cfg.tie_word_embeddings and cfg.num_attention_heads * cfg.head_dim == 64
    n_params = 100_000  # tied: the embedding is the LM head's matmul, so every parameter counts
    # 6 x 100,000 x 30 laid-out tokens + 6 x 2 layers x 64 x (10^2 + 20^2)
    assert bench_device.train_flops(cfg, n_params, 30, [10, 20]) == 6 * 100_000 * 30 + 6 * 2 * 64 * 500
    untied = dataclasses.replace(cfg, tie_word_embeddings=False)
    # untied: the input embedding (vocab x hidden) is a lookup, not a matmul
    assert bench_device.train_flops(untied, n_params, 30, [10, 20]) == 6 * (100_000 - 512 * 64) * 30 + 6 * 2 * 64 * 500


def test_the_15b_shape_has_qwen25_15bs_parameter_count():
    """Qwen2.5-1.5B: 1.54B parameters (its model card), 28 layers of 1536 with 12 query / 2 key-value heads."""
    cfg = bench_device.model_config(quick=False, model="1.5b")
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (1536, 8960, 28)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (12, 2, 128)
    d, i, kv = 1536, 8960, 256
    per_layer = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * i + 2 * d
    assert 28 * per_layer + 151936 * d + d == pytest.approx(1.54e9, rel=0.005)


def test_decode_floor_by_hand():
    """The quick model, 4 rows, 16 prompt + 5/8 x 16 response slots, bf16: weights + KV cache bytes, FLOPs."""
    cfg = bench_device.model_config(quick=True)
    weights = 2 * (64 * 64 + 2 * 64 * 32 + 64 * 64 + 3 * 64 * 128) + 64 * 512  # the tied LM head is a matmul
    kv_per_slot = 2 * 2 * 2 * 16 * 2  # k and v, 2 layers, 2 kv heads of 16, 2 bytes
    step_bytes, step_flops = bench_device.decode_floor(cfg, rows=4, prompt_len=16, new_tokens=16)
    assert step_bytes == 2 * weights + 4 * 26 * kv_per_slot
    assert step_flops == 2 * weights * 4 + 4 * 2 * 4 * 16 * 4 * 26  # matmuls + q.K and p.V over 26 slots


@pytest.mark.parametrize("kind, peak", [("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
                                        ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
                                        ("TPU v5 lite", 197e12), ("TPU v5p", 459e12), ("cpu", None)])
def test_nominal_peaks(kind, peak):
    assert bench_device.nominal_peak(kind) == peak


def test_the_decode_estimate_is_the_plans():
    """On an H100, one decode step of the quick model: `estimate.decode_step` at its bandwidth and peak."""
    from dapo_jax.training.plan.estimate import decode_step

    cfg = bench_device.model_config(quick=True)
    want, _, _ = decode_step(cfg, rows=4, context=16 + 5 * 64 / 8, itemsize=2, peak_flops=989e12, bandwidth=3350e9)
    got = bench_device.decode_estimate_ms(cfg, "NVIDIA H100 80GB HBM3", rows=4, prompt_len=16, new_tokens=64)
    assert got == pytest.approx(1e3 * want) and bench_device.decode_estimate_ms(cfg, "cpu", rows=4, prompt_len=16,
                                                                                new_tokens=64) is None


@pytest.mark.slow
def test_quick_run_reports_consistent_figures(tmp_path, capsys):
    out = tmp_path / "device.jsonl"
    assert bench_device.main(["--quick", "--phases", "train,decode_16", "--json", str(out)]) == 0
    train, decode = [json.loads(line) for line in out.read_text().splitlines()]
    printed = capsys.readouterr().out
    assert "train: step" in printed and "decode_16: 4 sequences x 16 new tokens" in printed

    assert train["phase"] == "train" and train["platform"] == "cpu" and train["mfu"] is None
    assert train["sequences"] == 2 * 4
    assert 0 < train["laid_out_tokens"] <= train["real_tokens"]  # shared prompts: each laid out once per row
    assert train["flops_per_s"] == pytest.approx(train["flops"] / train["step_s"])
    assert train["fraction_of_measured_peak"] == pytest.approx(train["flops_per_s"] / train["matmul_peak_flops_per_s"])
    assert train["flops"] > 6 * train["params"] * train["laid_out_tokens"]  # plus attention
    assert train["grad_norm"] > 0 and train["peak_memory_bytes"] > 0 and train["peak_memory_of"] == "host RSS"
    # by hand: tied 512 x 64 embedding, final norm 64; per layer q 64x64+64, k and v 64x32+32, o 64x64,
    # gate/up/down 3 x 64x128, two norms of 64
    per_layer = (64 * 64 + 64) + 2 * (64 * 32 + 32) + 64 * 64 + 3 * 64 * 128 + 2 * 64
    assert train["params"] == 512 * 64 + 64 + 2 * per_layer == 107_072

    assert decode["phase"] == "decode_16" and decode["new_tokens"] == 16 and decode["sequences"] == 4
    assert decode["tokens_per_s"] == pytest.approx(4 * 16 / decode["decode_s"])
    assert decode["step_ms"] == pytest.approx(1e3 * decode["decode_s"] / 16)
    assert decode["estimate_step_ms"] is None and train["estimate_s"] is None  # a CPU has no data-sheet peak
    assert (decode["step_bytes"], decode["step_flops"]) == bench_device.decode_floor(
        bench_device.model_config(quick=True), rows=4, prompt_len=16, new_tokens=16)
    assert decode["compile_s"] > 0
    assert decode["params"] == train["params"]


def test_a_failing_phase_makes_the_run_fail(capsys):
    assert bench_device.main(["--quick", "--phases", "decode_x"]) == 1  # not a length: the child fails
    assert "decode_x failed" in capsys.readouterr().out


def test_a_phase_past_its_timeout_is_killed_and_recorded(tmp_path, capsys):
    out = tmp_path / "device.jsonl"
    assert bench_device.main(["--quick", "--phases", "peaks", "--timeout", "0.01", "--json", str(out)]) == 1
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["phase"] == "peaks" and row["error"] == "timed out after 0 s"
    assert "peaks failed: timed out" in capsys.readouterr().out
