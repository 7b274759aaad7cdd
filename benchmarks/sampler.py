"""Generated tokens per second: dapo_jax's KV-cache sampler vs transformers `generate` (torch), same weights.

    python -m benchmarks.sampler                      # 0.6M, 5M, 15M params; 64 seqs x 128 new tokens
    python -m benchmarks.sampler --sizes 5m --repeats 5
    python -m benchmarks.sampler --gpu-size           # Qwen2.5-0.5B-shaped random model (for a GPU)

Both run in the same process back to back, interleaved, `--repeats` times; the best time of each is
reported (the machine may be shared). Compile time of the JAX sampler is measured separately and
excluded. Sampling: temperature `--temperature`, no top-k/top-p, no EOS (every sequence is exactly
`--new-tokens` long on both sides). Ours: `--prompts` prompts x G = `--group` samples (one prefill
per prompt); transformers: the same prompts with `num_return_sequences=G` (same 64 sequences).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

SIZES = {
    # name: (hidden, layers, heads, kv_heads, intermediate, vocab) -- qwen2, tied embeddings
    "0.6m": (128, 4, 4, 2, 256, 512),
    "5m": (256, 6, 8, 4, 768, 2048),
    "15m": (384, 8, 6, 2, 1152, 4096),
}
GPU_SIZE = dict(  # Qwen2.5-0.5B's shape, random weights
    hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
    intermediate_size=4864, vocab_size=151936, rope_theta=1e6, tie_word_embeddings=True,
    max_position_embeddings=32768,
)


def hf_dict(hidden, layers, heads, kv, inter, vocab) -> dict:
    return dict(
        model_type="qwen2", hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv, intermediate_size=inter, vocab_size=vocab, rope_theta=10000.0,
        tie_word_embeddings=True, max_position_embeddings=2048, rms_norm_eps=1e-6, hidden_act="silu",
    )


def make_prompts(n: int, max_len: int, vocab: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(max_len // 2, max_len + 1, size=n)
    return [rng.integers(1, vocab, size=int(k)) for k in lengths]


def build_models(hf: dict, dtype: str, with_torch: bool):
    """Our Decoder (random init) and, when asked, a transformers model carrying the same weights."""
    from flax import nnx

    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder

    cfg = ModelConfig.from_hf_dict(hf, param_dtype=dtype, dtype=dtype)
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    tmodel = None
    if with_torch:
        import torch
        import transformers

        config = transformers.Qwen2Config(**{k: v for k, v in hf.items() if k != "model_type"})
        tmodel = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
        _copy_to_torch(model, tmodel)
    return model, tmodel


def _copy_to_torch(model, tmodel) -> None:
    import torch

    def t(x):
        return torch.from_numpy(np.asarray(x[...], dtype=np.float32).copy())

    sd = {"model.embed_tokens.weight": t(model.embed_tokens.embedding), "model.norm.weight": t(model.norm.weight)}
    for i, layer in enumerate(model.layers):
        pre = f"model.layers.{i}."
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            lin = getattr(layer.self_attn, name)
            sd[pre + f"self_attn.{name}.weight"] = t(lin.kernel).T.contiguous()
            if lin.bias is not None:
                sd[pre + f"self_attn.{name}.bias"] = t(lin.bias)
        for name in ("gate_proj", "up_proj", "down_proj"):
            sd[pre + f"mlp.{name}.weight"] = t(getattr(layer.mlp, name).kernel).T.contiguous()
        sd[pre + "input_layernorm.weight"] = t(layer.input_layernorm.weight)
        sd[pre + "post_attention_layernorm.weight"] = t(layer.post_attention_layernorm.weight)
    if not model.config.tie_word_embeddings:
        sd["lm_head.weight"] = t(model.lm_head.kernel).T.contiguous()
    missing, unexpected = tmodel.load_state_dict(sd, strict=False)
    missing = [m for m in missing if m != "lm_head.weight"]  # tied
    if missing or unexpected:
        raise RuntimeError(f"weight copy mismatch: missing={missing} unexpected={unexpected}")


def bench_size(name: str, hf: dict, args) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dapo_jax.sampling import SamplingConfig, make_generate, pad_to_bucket

    with_torch = not args.no_hf
    model, tmodel = build_models(hf, args.dtype, with_torch)
    n_params = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    prompts = make_prompts(args.prompts, args.prompt_len, hf["vocab_size"])
    ids, mask = pad_to_bucket(prompts, (args.prompt_len,), pad_id=0)
    config = SamplingConfig(max_new_tokens=args.new_tokens, temperature=args.temperature, eos_token_ids=(), pad_token_id=0)
    graphdef, state = nnx.split(model)
    gen = make_generate(graphdef, config, args.group)
    ids_j, mask_j = jnp.asarray(ids), jnp.asarray(mask)
    n_tokens = args.prompts * args.group * args.new_tokens

    t0 = time.perf_counter()
    jax.block_until_ready(gen(state, ids_j, mask_j, jax.random.key(0)))
    first_call = time.perf_counter() - t0

    def run_ours(i):
        t = time.perf_counter()
        out = gen(state, ids_j, mask_j, jax.random.key(i + 1))
        jax.block_until_ready(out)
        dt = time.perf_counter() - t
        assert int(out.lengths.min()) == args.new_tokens
        return dt

    def run_hf(i, new_tokens=args.new_tokens):
        import torch

        torch.manual_seed(i)
        t = time.perf_counter()
        with torch.inference_mode():
            out = tmodel.generate(
                torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                do_sample=True, temperature=args.temperature, top_k=0, top_p=1.0,
                max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                num_return_sequences=args.group, pad_token_id=0, eos_token_id=None,
            )
        dt = time.perf_counter() - t
        assert out.shape == (args.prompts * args.group, ids.shape[1] + new_tokens), out.shape
        return dt

    threads = None
    if with_torch:
        import torch

        run_hf(0)  # warm-up (allocator, lazy inits)
        threads = args.torch_threads
        if threads == 0:  # on a shared CPU, 1 thread can beat 2 by 10x (spinning workers): give torch its best
            timed = {}
            for n in (1, os.cpu_count() or 1):
                torch.set_num_threads(n)
                timed[n] = run_hf(0, new_tokens=16)
            threads = min(timed, key=timed.get)
        torch.set_num_threads(threads)
    ours, theirs = [], []
    for i in range(args.repeats):
        ours.append(run_ours(i))
        if with_torch:
            theirs.append(run_hf(i))
    result = dict(
        size=name, params=n_params, sequences=args.prompts * args.group, new_tokens=args.new_tokens,
        compile_s=first_call - min(ours), ours_s=min(ours), ours_tok_s=n_tokens / min(ours),
        ours_all=ours, hf_all=theirs, torch_threads=threads,
    )
    if with_torch:
        result.update(hf_s=min(theirs), hf_tok_s=n_tokens / min(theirs), speedup=min(theirs) / min(ours))
    return result


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--gpu-size", action="store_true", help="one Qwen2.5-0.5B-shaped random model instead")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8, help="G responses per prompt")
    parser.add_argument("--prompt-len", type=int, default=32, help="prompt bucket (prompts are len/2..len)")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--torch-threads", type=int, default=0, help="0: try 1 and all cores, keep the faster")
    parser.add_argument("--no-hf", action="store_true", help="skip transformers (default with --gpu-size)")
    parser.add_argument("--with-hf", action="store_true", help="run transformers even with --gpu-size")
    args = parser.parse_args(argv)

    import jax

    if args.gpu_size:
        args.no_hf = not args.with_hf
        runs = [("qwen2.5-0.5b-shape", dict(hf_dict(1, 1, 1, 1, 1, 1), **GPU_SIZE))]
    else:
        runs = [(s, hf_dict(*SIZES[s])) for s in args.sizes]
    print(f"jax {jax.__version__} on {jax.devices()[0].platform} x{jax.device_count()}, "
          f"{os.cpu_count()} CPU cores, dtype {args.dtype}")
    header = f"{'size':>20} {'params':>10} {'compile s':>10} {'ours tok/s':>11} {'hf tok/s':>10} {'ratio':>6}"
    print(header)
    for name, hf in runs:
        r = bench_size(name, hf, args)
        hf_cell = f"{r['hf_tok_s']:10.0f} {r['speedup']:5.2f}x" if "hf_s" in r else f"{'-':>10} {'-':>6}"
        print(f"{name:>20} {r['params'] / 1e6:9.2f}M {r['compile_s']:10.2f} {r['ours_tok_s']:11.0f} {hf_cell}", flush=True)
        print(f"{'':>20} ours s: {[round(x, 3) for x in r['ours_all']]}  hf s: {[round(x, 3) for x in r['hf_all']]}"
              f"  torch threads: {r['torch_threads']}", flush=True)


if __name__ == "__main__":
    main()
