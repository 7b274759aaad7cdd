"""An ESTIMATE of a training step's time on a TPU slice or a local GPU, counted from the config (not measured).

    est = step_time(cfg, model_cfg, mesh={"data": 1, "fsdp": 32, "tensor": 1}, chip=CHIPS["v5p"], devices=32)

Why from the config: XLA's `cost_analysis()` counts a `lax.scan` or while-loop body once (the scanned
trunk, the decode loop) and cannot see into Pallas kernels, so its FLOPs read many times low.

Assumptions (printed with the figures):
- matmul FLOPs per token `2 N` forward, `N` the matmul weights (`L (d H D + 2 d H_kv D + H D d + 3 d I) + d V`);
  causal attention `2 L H D n^2` forward per sequence of `n` tokens (the half of the square below the
  diagonal, as the causal kernels compute it); training = 3 forwards (forward + backward), 4 with
  `remat: full` (the forward again);
- every response `response_tokens` long (default `rollout.max_new_tokens`: the longest case), every prompt
  `data.max_prompt_length`; a packed update computes the real tokens only (each group's prompt once with
  shared prompts), an unpacked one every position of `S + T`; the log-prob passes are unpacked;
- the update and log-prob passes at the chip's bf16 peak (an upper bound on speed: real runs reach a
  fraction of it, `mfu`, default 1.0);
- the rollout: `ceil(train_batch / gen_batch)` generation rounds of `gen_batch` prompts (the fewest that can
  fill the batch; dynamic sampling may need more), each its prefill at the bf16 peak and `T` decode steps,
  each step the larger of its matmul FLOPs at the peak and the bytes it reads from HBM (the sampler's weights,
  once all-gathered over fsdp, and each row's KV cache, about `S + 5T/8` slots with the sampler's blocks)
  over the HBM bandwidth; collectives are not counted.
"""

from __future__ import annotations

import jax.numpy as jnp

from dapo_jax.training.config.run import RunConfig


def matmul_params(m) -> int:
    """N: the weights every token multiplies (the embedding lookup is not a matmul; the LM head is)."""
    h, kv, d, hd, i = m.num_attention_heads, m.num_key_value_heads, m.hidden_size, m.head_dim, m.intermediate_size
    return m.num_hidden_layers * (d * h * hd + 2 * d * kv * hd + h * hd * d + 3 * d * i) + d * m.vocab_size


def forward_flops(m, n: float, *, head: bool = True) -> float:
    """One sequence of `n` tokens, forward: matmuls + causal attention."""
    weights = matmul_params(m) - (0 if head else m.hidden_size * m.vocab_size)
    return 2.0 * weights * n + 2.0 * m.num_hidden_layers * m.num_attention_heads * m.head_dim * n * n


def decode_step(m, *, rows: float, context: float, itemsize: int, peak_flops: float, bandwidth: float,
                weight_shards: int = 1, row_shards: int = 1) -> tuple[float, float, float]:
    """One decode step of `rows` sequences over `context` cached slots: `(seconds, bytes read per device, FLOPs)`,
    the seconds the larger of its matmul + attention FLOPs at `peak_flops` (all devices together) and the
    bytes one device reads (its share of the weights and of the KV cache) over its HBM `bandwidth`."""
    kv_per_slot = 2 * m.num_hidden_layers * m.num_key_value_heads * m.head_dim * itemsize
    step_bytes = (matmul_params(m) * itemsize + rows / row_shards * context * kv_per_slot) / weight_shards
    step_flops = 2.0 * matmul_params(m) * rows + 4.0 * m.num_hidden_layers * m.num_attention_heads * m.head_dim * rows * context
    return max(step_bytes / bandwidth, step_flops / peak_flops), step_bytes, step_flops


def step_time(cfg: RunConfig, m, *, mesh: dict, chip, devices: int, response_tokens: int | None = None,
              mfu: float = 1.0, share_prompts: bool | None = None) -> dict:
    """Seconds per phase and tokens/s per chip, with the assumptions (module docstring). `chip`: a
    `slices.Chip`, or None (no estimate: the peak and bandwidth are unknown); `share_prompts`: whether the
    packed update shares a group's prompt (default `optim.packing_share_prompts`; not with splash)."""
    if chip is None:
        return {"note": "no step-time estimate: it needs the accelerator's bf16 peak and HBM bandwidth, a TPU slice's "
                        "(--topology) or a GPU's or TPU's that training/plan/chips.py knows"}
    r, o = cfg.rollout, cfg.optim
    p, g, s, t = r.train_batch, r.G, cfg.data.max_prompt_length, r.max_new_tokens
    tbar = min(response_tokens or t, t)
    train_k = 4 if m.remat == "full" else 3
    peak = chip.device_flops * devices * mfu  # the slice's FLOP/s
    bandwidth = chip.device_bandwidth  # per device
    objective = cfg.objective_config

    if o.packing:
        share = o.packing_share_prompts if share_prompts is None else share_prompts
        update_flops = p * (g * forward_flops(m, s + tbar) - ((g - 1) * forward_flops(m, s) if share else 0)) * train_k
    else:
        update_flops = p * g * forward_flops(m, s + t) * train_k
    passes = int(cfg.recompute_old_logp) + int(objective.needs_reference)
    if getattr(objective, "high_entropy_quantile", None) is not None or getattr(objective, "entropy_driven_advantage", False):
        passes += 1  # the update's no-gradient entropy pass
    logprob_flops = passes * p * g * forward_flops(m, s + t)
    critic_flops = 0.0
    if objective.uses_critic:
        critic_flops = p * g * forward_flops(m, s + t, head=False) * (1 + train_k)  # values + its update

    rows = r.gen_batch * g
    context = s + 5 * t / 8
    one_step, step_bytes, step_flops = decode_step(m, rows=rows, context=context,
                                                   itemsize=jnp.dtype(cfg.sampler_dtype).itemsize,
                                                   peak_flops=peak, bandwidth=bandwidth, weight_shards=mesh["tensor"],
                                                   row_shards=mesh["data"] * mesh["fsdp"])
    decode_s = t * one_step
    prefill_s = r.gen_batch * forward_flops(m, s) / peak
    rounds = -(-p // r.gen_batch)  # a long-context recipe generates fewer prompts at a time than it trains on
    seconds = {"rollout": rounds * (prefill_s + decode_s), "log-prob": logprob_flops / peak, "update": update_flops / peak,
               "critic": critic_flops / peak}
    step = sum(seconds.values())
    chips = devices / chip.devices_per_chip
    trained = p * g * (s + tbar)
    return {
        "seconds": {k: v for k, v in seconds.items() if v},
        "step_s": step,
        "rollout_decode_step_ms": 1e3 * one_step,
        "decode_bound": "HBM bandwidth" if step_bytes / bandwidth >= step_flops / peak else "compute",
        "tokens_per_s_per_chip": trained / step / chips,
        "generated_tokens_per_s_per_chip": rounds * rows * tbar / seconds["rollout"] / chips,
        "rollout_rounds": rounds,
        "flops": {"update": update_flops, "log-prob": logprob_flops, "critic": critic_flops,
                  "rollout prefill": rounds * r.gen_batch * forward_flops(m, s),
                  "rollout decode": rounds * t * step_flops},
        "assumptions": [
            f"{chip.family}: {chip.bf16_tflops:g} TFLOP/s bf16 and {chip.hbm_gbps:g} GB/s HBM a chip ({chip.source})"
            + (f", at {mfu:.0%} of the peak" if mfu != 1.0 else ", at 100% of the peak (a lower bound on time)"),
            f"responses of {tbar} tokens, prompts of {s}; {'packed' if o.packing else 'unpacked'} update, "
            f"{train_k} forwards' worth of FLOPs per token ({'remat full' if train_k == 4 else 'forward + backward'})",
            f"{rounds} rollout round{'s' * (rounds > 1)} of {r.gen_batch} prompts x {g} (the fewest that fill "
            f"train_batch {p}; dynamic sampling may need more): {t} decode steps each, each bound by "
            f"max(FLOPs / peak, bytes read / HBM bandwidth); collectives and host work not counted",
            "tokens/s per chip = train_batch x G x (prompt + response tokens) / step time / chips",
        ],
    }


__all__ = ["decode_step", "forward_flops", "matmul_params", "step_time"]
