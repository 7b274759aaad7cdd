"""Attention's cost per implementation (models/attention.py): memory from compiled TPU programs, time on this device.

    python -m benchmarks.attention memory --topology v5e:2x2 --lengths 8192 16384 20480
    python -m benchmarks.attention time --lengths 128 256 512 1024 2048 --heads 14 --kv-heads 2 --head-dim 64

`memory`: one attention's forward + backward (the gradient of a sum of its output w.r.t. q, k and v) at
Qwen2.5-0.5B's attention shape (14 query / 2 key-value heads of 64, bf16, one row) compiled for one
device of the TPU topology, without the hardware: XLA's per-device `memory_analysis()` temporaries, and
the compile time. A program the TPU compiler refuses prints its "required / available" line.

`time`: the median wall time of the same forward + backward on this machine's device per implementation
(reference and blockwise; with gpu_flash on a GPU, splash on a TPU; float32 on a CPU, bf16 elsewhere) and
the compiled program's temporaries; on a CPU, the figure `auto`'s threshold (`attention.CPU_BLOCKWISE_FROM`)
comes from.
Each measurement is one result line (`benchmarks.harness.emit`).
"""

from __future__ import annotations

import argparse
import sys
import time

from benchmarks.harness import emit, median_time

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
            emit(rec)


def timing(args) -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np

    platform = jax.default_backend()
    local = {"gpu": ("gpu_flash",), "tpu": ("splash",)}.get(platform, ())
    impls = args.impls or ["reference", "blockwise", *local]
    dtype = jnp.float32 if platform == "cpu" else jnp.bfloat16  # the CPU has no fast bf16 matmul
    for s in args.lengths:
        for impl in impls:
            ins = shapes(s, args.heads, args.kv_heads, args.head_dim, dtype)
            arrays = [jnp.asarray(np.random.default_rng(0).normal(size=x.shape), x.dtype) for x in ins[:3]]
            arrays.append(jnp.ones(ins[3].shape, jnp.int32))
            rec = {"what": f"attention fwd+bwd time ({platform})", "impl": impl, "seq_len": s, "heads": args.heads,
                   "kv_heads": args.kv_heads, "head_dim": args.head_dim, "dtype": jnp.dtype(dtype).name}
            try:
                fn = attention_grad(impl)
                m = fn.lower(*arrays).compile().memory_analysis()
                if m is not None:
                    rec["temp_gib"] = round(m.temp_size_in_bytes / 2**30, 4)
                first, med = median_time(fn, *arrays, repeats=args.repeats)
                rec.update(median_ms=round(1e3 * med, 3), first_s=round(first, 2))
            except Exception as e:  # noqa: BLE001 - out of memory is a result
                rec["error"] = str(e).splitlines()[0][:300]
            emit(rec)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mode", choices=("memory", "time"))
    ap.add_argument("--topology", default="v5e:2x2")
    ap.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384])
    ap.add_argument("--impls", nargs="+", default=None,
                    help="default: memory, reference blockwise splash; time, reference blockwise + the device's kernel")
    ap.add_argument("--heads", type=int, default=14)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--head-dim", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    if args.mode == "memory":
        args.impls = args.impls or list(IMPLS_TPU)
    else:
        from dapo_jax.training.plan.slices import quiet_tpu_environment

        quiet_tpu_environment()  # time on this machine's own device, without libtpu's warnings where none is a TPU
    (memory if args.mode == "memory" else timing)(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
