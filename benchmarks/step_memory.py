"""Peak host memory of one DAPO step (rollout + update) of a Qwen2.5-0.5B-shaped model on CPU.

    python -m benchmarks.step_memory make-model /tmp/qwen0.5b-random  # random bf16 weights, 494M params
    python -m benchmarks.step_memory run /tmp/qwen0.5b-random          # one step under /usr/bin/time -v
    python -m benchmarks.step_memory plan /tmp/qwen0.5b-random         # `dapo-jax plan` of the same step
    python -m benchmarks.step_memory remat                             # does remat free activations here?

`make-model` writes Qwen2.5-0.5B's config.json values with random bf16 weights (988 MB) and the
Qwen2.5 tokenizer from ../shared/tokenizers/qwen2.5 into a folder outside the checkout. `run` trains
the recipe qwen2.5-0.5b-gsm8k-dapo (float32 master weights, bf16 compute, dots_saveable remat) for
one step with the overrides below (G=2, 64 new tokens, 2 prompts, no evaluation, GSM8K test prompts
from ../shared) and prints the process's maximum resident set size. Run one at a time: it needs
about 13 GiB and several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import REPO as ROOT
from benchmarks.harness import run as run_command

SHARED = ROOT.parent / "shared"
CONFIG = ROOT / "dapo_jax" / "configs" / "qwen2.5-0.5b-gsm8k-dapo.yaml"

QWEN25_05B = dict(  # Qwen2.5-0.5B-Instruct's config.json (shapes and constants; weights here are random)
    architectures=["Qwen2ForCausalLM"], model_type="qwen2", hidden_size=896, intermediate_size=4864,
    num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, vocab_size=151936,
    max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
    hidden_act="silu", bos_token_id=151643, eos_token_id=151645, torch_dtype="bfloat16",
)


def overrides(model_dir: str, run_dir: str) -> list[str]:
    gsm8k = SHARED / "data" / "gsm8k" / "test.jsonl"
    return [
        f"model.path={model_dir}", f"data.train.name={gsm8k}", "data.eval=null",
        "rollout.G=2", "rollout.max_new_tokens=64", "rollout.train_batch=2", "rollout.gen_batch=2",
        "objective.dynamic_sampling=false", "objective.overlong_buffer=16",  # random weights never answer right
        "optim.num_minibatches=1", "optim.micro_batches=1",
        "train.steps=1", "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false",
        "train.rollouts_every=0", f"train.run_dir={run_dir}",
    ]


def make_model(out: Path) -> None:
    from safetensors.numpy import save_file

    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.models.hf_names import hf_name

    import ml_dtypes
    from flax import nnx

    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(QWEN25_05B, indent=1))
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(SHARED / "tokenizers" / "qwen2.5" / name, out / name)
    cfg = ModelConfig.from_pretrained(out)
    abstract = nnx.eval_shape(lambda: Decoder(cfg, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    tensors = {}
    for path, var in nnx.to_flat_state(nnx.state(abstract, nnx.Param)):
        shape = var.get_value().shape
        name = hf_name(path)
        is_kernel = str(path[-1]) == "kernel"
        hf_shape = shape[::-1] if is_kernel else shape
        if name.endswith("norm.weight"):
            x = np.ones(hf_shape, np.float32)
        else:
            x = rng.standard_normal(hf_shape, dtype=np.float32) * 0.02
        tensors[name] = x.astype(ml_dtypes.bfloat16)
    save_file(tensors, str(out / "model.safetensors"))
    n = sum(t.size for t in tensors.values())
    print(f"wrote {out}: {n / 1e6:.1f}M parameters")


def run(model_dir: str, extra: list[str]) -> None:
    run_dir = tempfile.mkdtemp(prefix="bench_step_memory_")
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "dapo_jax.cli", "train", str(CONFIG),
           *overrides(model_dir, run_dir), *extra]
    print(" ".join(cmd[2:]), flush=True)
    t0 = time.perf_counter()
    proc = run_command(cmd)
    wall = time.perf_counter() - t0
    shutil.rmtree(run_dir, ignore_errors=True)
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    if proc.returncode or rss is None:
        print(proc.stdout[-3000:], proc.stderr[-8000:].split("Command being timed")[0])
        raise SystemExit(f"train failed (exit {proc.returncode})")
    print(proc.stdout.strip().splitlines()[-1])
    print(f"max RSS {int(rss.group(1)) / 2**20:.2f} GiB, wall {wall:.0f} s")


def plan(model_dir: str, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "dapo_jax.cli", "plan", str(CONFIG), *overrides(model_dir, "/tmp/unused"), *extra]
    print(" ".join(cmd[1:]), flush=True)
    raise SystemExit(run_command(cmd, capture=False).returncode)


def remat() -> None:
    """Temporaries (XLA's memory_analysis) of one jitted gradient of a 12-layer decoder's forward, per
    remat policy and compute dtype: whether remat frees activations on this backend."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder, positions_from_mask

    ids = jnp.ones((4, 512), jnp.int32)
    for policy in ("none", "full", "dots_saveable"):
        for dtype in ("bfloat16", "float32"):
            cfg = ModelConfig(model_type="qwen2", vocab_size=1024, hidden_size=512, intermediate_size=2048,
                              num_hidden_layers=12, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
                              dtype=dtype, remat=policy)
            graphdef, params = nnx.split(nnx.eval_shape(lambda c=cfg: Decoder(c, rngs=nnx.Rngs(0))), nnx.Param)

            def loss(p, graphdef=graphdef):
                hidden, _ = nnx.merge(graphdef, p)(ids, positions_from_mask(ids), ids)
                return jnp.sum(hidden.astype(jnp.float32) ** 2)

            temp = jax.jit(jax.grad(loss)).lower(params).compile().memory_analysis().temp_size_in_bytes
            print(f"remat={policy:14s} dtype={dtype:9s} temporaries {temp / 2**20:8.1f} MiB", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("action", choices=["make-model", "run", "plan", "remat"])
    parser.add_argument("model_dir", nargs="?", help="the model folder (not for remat)")
    parser.add_argument("extra", nargs="*", help="further config overrides")
    args = parser.parse_args()
    if args.action == "remat":
        remat()
    elif args.model_dir is None:
        parser.error(f"{args.action} needs MODEL_DIR")
    elif args.action == "make-model":
        make_model(Path(args.model_dir))
    elif args.action == "run":
        run(args.model_dir, args.extra)
    else:
        plan(args.model_dir, args.extra)


if __name__ == "__main__":
    main()
