"""The step-time ESTIMATE (training/plan/estimate.py) against FLOPs and bytes counted by hand for the tiny model."""

import jax.numpy as jnp
import pytest

from dapo_jax.training.config.run import load_config
from dapo_jax.training.plan.chips import chip_for
from dapo_jax.training.plan.estimate import decode_step, forward_flops, matmul_params, step_time
from dapo_jax.training.plan.slices import CHIPS

TINY = "configs/tiny_dapo.yaml"
MESH = {"data": 1, "fsdp": 4, "tensor": 1}


@pytest.fixture(scope="module")
def tiny_model():
    from dapo_jax.models.config import ModelConfig

    return ModelConfig.from_pretrained("dapo_jax/assets/tiny_base")  # d 64, I 192, L 2, H 4, H_kv 2, D 16, V 99


def test_flops_by_hand(tiny_model):
    per_layer = 64 * 4 * 16 + 2 * 64 * 2 * 16 + 4 * 16 * 64 + 3 * 64 * 192  # q, k+v, o, gate+up+down
    assert matmul_params(tiny_model) == 2 * per_layer + 64 * 99  # + the (tied) output embedding
    n = 14
    assert forward_flops(tiny_model, n) == 2 * (2 * per_layer + 64 * 99) * n + 2 * 2 * 4 * 16 * n * n


def test_update_and_logprob_seconds_are_flops_over_the_peak(tiny_model):
    cfg = load_config(TINY, ["rollout.recompute_old_logp=true", "optim.packing=false"])  # the padded layout's count
    est = step_time(cfg, tiny_model, mesh=MESH, chip=CHIPS["v5e"], devices=4)
    p, g, s, t = 16, 8, 8, 6
    peak = 197e12 * 4
    assert est["flops"]["update"] == pytest.approx(p * g * forward_flops(tiny_model, s + t) * 3)
    assert est["seconds"]["update"] == pytest.approx(est["flops"]["update"] / peak)
    assert est["seconds"]["log-prob"] == pytest.approx(p * g * forward_flops(tiny_model, s + t) / peak)  # one pass
    assert est["tokens_per_s_per_chip"] == pytest.approx(p * g * (s + t) / est["step_s"] / 4)
    half = step_time(cfg, tiny_model, mesh=MESH, chip=CHIPS["v5e"], devices=4, mfu=0.5)
    assert half["seconds"]["update"] == pytest.approx(2 * est["seconds"]["update"])
    assert any("ESTIMATE" not in a and "peak" in a for a in est["assumptions"])


def test_remat_and_packing_change_the_count(tiny_model):
    cfg = load_config(TINY, ["optim.packing=false"])
    base = step_time(cfg, tiny_model, mesh=MESH, chip=CHIPS["v5p"], devices=4)["flops"]["update"]
    full = step_time(cfg, tiny_model.replace(remat="full"), mesh=MESH, chip=CHIPS["v5p"], devices=4)["flops"]["update"]
    assert full == pytest.approx(base * 4 / 3)  # the forward again
    packed = step_time(load_config(TINY, ["optim.packing=true"]), tiny_model, mesh=MESH, chip=CHIPS["v5p"], devices=4,
                       response_tokens=3)["flops"]["update"]
    # each group's prompt once, each of its G responses 3 tokens after it
    p, g, s = 16, 8, 8
    assert packed == pytest.approx(p * (g * forward_flops(tiny_model, s + 3) - (g - 1) * forward_flops(tiny_model, s)) * 3)


def test_decode_is_bandwidth_bound_until_the_batch_is_large(tiny_model):
    small = step_time(load_config(TINY), tiny_model, mesh=MESH, chip=CHIPS["v5e"], devices=4)
    assert small["decode_bound"] == "HBM bandwidth"
    big = step_time(load_config(TINY, ["rollout.gen_batch=262144", "rollout.max_gen_batches=1"]), tiny_model.replace(
        vocab_size=200_000), mesh={"data": 1, "fsdp": 1, "tensor": 1}, chip=CHIPS["v5e"], devices=1)
    assert big["decode_bound"] == "compute"
    assert step_time(load_config(TINY), tiny_model, mesh=MESH, chip=None, devices=4).get("seconds") is None


def test_rollout_counts_the_rounds_that_fill_the_batch(tiny_model):
    """train_batch 16 from rounds of 4 prompts: at least 4 rounds, each with its prefill and T decode steps."""
    one = step_time(load_config(TINY), tiny_model, mesh=MESH, chip=CHIPS["v5e"], devices=4)  # gen_batch 32 >= 16
    assert one["rollout_rounds"] == 1
    cfg = load_config(TINY, ["rollout.gen_batch=4", "rollout.max_gen_batches=8"])
    est = step_time(cfg, tiny_model, mesh=MESH, chip=CHIPS["v5e"], devices=4)
    t, s = 6, 8
    peak, bandwidth = 197e12 * 4, 819e9
    size = jnp.dtype(cfg.sampler_dtype).itemsize
    rows, context, kv = 4 * 8, s + 5 * t / 8, 2 * 2 * 2 * 16 * size  # k and v, 2 layers, 2 KV heads, D 16
    step_bytes = matmul_params(tiny_model) * size + rows / 4 * context * kv
    step_flops = 2.0 * matmul_params(tiny_model) * rows + 4.0 * 2 * 4 * 16 * rows * context
    per_round = 4 * forward_flops(tiny_model, s) / peak + t * max(step_bytes / bandwidth, step_flops / peak)
    assert est["rollout_rounds"] == 4
    assert est["seconds"]["rollout"] == pytest.approx(4 * per_round)
    assert est["generated_tokens_per_s_per_chip"] == pytest.approx(4 * rows * t / est["seconds"]["rollout"] / 4)
    assert any("4 rollout rounds of 4 prompts" in a for a in est["assumptions"])


def test_one_decode_step_by_hand(tiny_model):
    """`decode_step`: 4 rows over 10 slots, float32, weights over 2 tensor shards and rows over 2 row shards."""
    n, kv = matmul_params(tiny_model), 2 * 2 * 2 * 16 * 4  # k and v, 2 layers, 2 KV heads, D 16, 4 bytes
    seconds, step_bytes, step_flops = decode_step(tiny_model, rows=4, context=10, itemsize=4, peak_flops=1e12,
                                                  bandwidth=1e9, weight_shards=2, row_shards=2)
    assert step_bytes == pytest.approx((n * 4 + 4 / 2 * 10 * kv) / 2)
    assert step_flops == pytest.approx(2 * n * 4 + 4 * 2 * 4 * 16 * 4 * 10)
    assert seconds == pytest.approx(max(step_bytes / 1e9, step_flops / 1e12))


def test_a_local_gpu_gets_an_estimate(tiny_model):
    """A plan made on a GPU machine (no --topology) counts against that GPU's data-sheet figures."""
    h100 = chip_for("NVIDIA H100 80GB HBM3")
    est = step_time(load_config(TINY), tiny_model, mesh={"data": 1, "fsdp": 1, "tensor": 1}, chip=h100, devices=1)
    assert est["seconds"]["update"] == pytest.approx(est["flops"]["update"] / 989e12)
    assert "H100 SXM: 989 TFLOP/s bf16 and 3350 GB/s" in est["assumptions"][0]
    note = step_time(load_config(TINY), tiny_model, mesh=MESH, chip=chip_for("cpu"), devices=4)["note"]
    assert "training/plan/chips.py" in note
