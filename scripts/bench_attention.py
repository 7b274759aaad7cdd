"""Attention's cost per implementation (models/attention.py): memory from compiled TPU programs, time on this CPU.

    python scripts/bench_attention.py memory --topology v5e:2x2 --lengths 8192 16384 20480
    python scripts/bench_attention.py time --lengths 128 256 512 1024 2048 --heads 14 2 --head-dim 64

`memory`: one attention's forward + backward (the gradient of a sum of its output w.r.t. q, k and v) at
Qwen2.5-0.5B's attention shape (14 query / 2 key-value heads of 64, bf16, one row) compiled for one
device of the TPU topology, without the hardware: XLA's per-device `memory_analysis()` temporaries, and
the compile time. A program the TPU compiler refuses prints its "required / available" line.

`time`: the median wall time of the same forward + backward on this machine's CPU per implementation
(reference and blockwise), the figure `auto`'s CPU threshold (`attention.CPU_BLOCKWISE_FROM`) comes from.
Each line is one JSON record.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

IMPLS_TPU = ("reference", "blockwise", "splash")


def attention_grad(impl: str, interpret: bool = False):
    import jax
    import jax.numpy as jnp

    from dapo_jax.models import attention

    def loss(q, k, v, mask):
        ids = attention.mask_ids(mask)
        return jnp.sum(attention.attend(q, k, v, ids, implementation=impl).astype(jnp.float32))

    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def shapes(s: int, heads: int, kv_heads: int, head_dim: int, dtype, sharding=None):
    import jax
    import jax.numpy as jnp

    sds = lambda shape, dt: jax.ShapeDtypeStruct(shape, dt, sharding=sharding)  # noqa: E731
    r = heads // kv_heads
    return (sds((1, s, kv_heads, r, head_dim), dtype), sds((1, s, kv_heads, head_dim), dtype),
            sds((1, s, kv_heads, head_dim), dtype), sds((1, s), jnp.int32))


def memory(args) -> None:
    import jax
    import jax.numpy as jnp
    from jax.experimental import topologies
    from jax.sharding import NamedSharding, PartitionSpec

    topo = topologies.get_topology_desc(platform="tpu", topology_name=args.topology)
    mesh = jax.make_mesh((1, 1, 1), ("data", "fsdp", "tensor"), devices=topo.devices[:1])
    for s in args.lengths:
        for impl in args.impls:
            t0 = time.perf_counter()
            rec = {"what": "attention fwd+bwd memory", "topology": args.topology, "impl": impl, "seq_len": s,
                   "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim}
            try:
                with jax.set_mesh(mesh):
                    ins = shapes(s, args.heads, args.kv_heads, args.head_dim, jnp.bfloat16,
                                 NamedSharding(mesh, PartitionSpec()))
                    compiled = attention_grad(impl).lower(*ins).compile()
                m = compiled.memory_analysis()
                rec.update(temp_gib=m.temp_size_in_bytes / 2**30, args_gib=m.argument_size_in_bytes / 2**30)
            except Exception as e:  # noqa: BLE001 - a refusal is a result
                rec["error"] = str(e).splitlines()[0][:300]
            rec["compile_s"] = round(time.perf_counter() - t0, 1)
            print(json.dumps(rec), flush=True)


def timing(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    for s in args.lengths:
        for impl in ("reference", "blockwise"):
            ins = shapes(s, args.heads, args.kv_heads, args.head_dim, jnp.float32)
            arrays = [jnp.asarray(np.random.default_rng(0).normal(size=x.shape), x.dtype) for x in ins[:3]]
            arrays.append(jnp.ones(ins[3].shape, jnp.int32))
            fn = attention_grad(impl)
            jax.block_until_ready(fn(*arrays))
            times = []
            for _ in range(args.repeats):
                t0 = time.perf_counter()
                jax.block_until_ready(fn(*arrays))
                times.append(time.perf_counter() - t0)
            print(json.dumps({"what": "attention fwd+bwd time (cpu)", "impl": impl, "seq_len": s, "heads": args.heads,
                              "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                              "median_ms": round(1e3 * float(np.median(times)), 3),
                              "min_ms": round(1e3 * min(times), 3)}), flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("memory", "time"))
    ap.add_argument("--topology", default="v5e:2x2")
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--impls", nargs="+", default=list(IMPLS_TPU))
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    (memory if args.mode == "memory" else timing)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
