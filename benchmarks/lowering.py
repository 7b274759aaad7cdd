"""What the compiler makes of the decode step, the rollout, the prefill and the updates: kernels, calls, bytes.

    python -m benchmarks.lowering                         # the CPU backend, a tiny Qwen-shaped model
    python -m benchmarks.lowering --topology v5e-4        # compiled for a TPU slice without one (the [tpu] extra)
    python -m benchmarks.lowering --json lowering.json

Each program is compiled ahead of time and its optimised HLO (`compiled.as_text()`) is read:
- **kernels**: the instructions that run as a kernel of their own (a fusion, a dot, a custom call, a copy,
  a sort, ...; not parameters, constants, tuples, bitcasts or the control flow itself), counted in the
  entry computation and in every computation it runs through `while`, `conditional` and `call`;
  **in loops**: those inside a `while` body, run once per iteration (a decode step is one iteration);
- **per layer**: the difference between the program compiled at 4 and at 2 layers, halved: what one
  more layer adds (the rest is embedding, logits, sampling);
- **custom calls** by target, **collectives** (all-gather, all-reduce, reduce-scatter, all-to-all,
  collective-permute) with the largest one's bytes, **host transfers in loops** (infeed, outfeed, send,
  recv, host callbacks inside a `while` body: a round trip to the host each decode step);
- **largest copy in a loop** (bytes): a cache update that is not in place copies the whole cache block;
- **sorts**: a sampler with top-p 1 and no top-k needs none (`sampling/processors.py`);
- **bytes accessed** (`compiled.cost_analysis()`) of one decode step, set against the weights and the KV
  cache it must read once (`weights + cache`).

The programs: `decode step` (`models.decode.decode_step`, one token per row over a prompt and a response
cache, with the fused `[q|k|v]` / `[gate|up]` kernels built outside it, as the rollout does; beside it the same
step with each block's separate projections), `rollout` (`make_generate`: prefill and every decode loop), `prefill` (the model's cached
forward over the prompt), and the update programs of the tiny DAPO recipe as `dapo-jax plan` lowers
them (`training/plan/programs.build_world`): `prepare` (log π_old), the unpacked `update`, and the packed
update's stages. `tests/benchmarks/test_lowering.py` guards the decode loop at a tiny shape.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import re
import sys

import jax
import jax.numpy as jnp
from flax import nnx

from benchmarks.device import QUICK_SHAPE
from benchmarks.step_memory import QWEN25_05B
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decode import (
    decode_step, empty_response_cache, fused_layers, prompt_cache_from_prefill,
)
from dapo_jax.models.decoder import Decoder, KVCache, positions_from_mask
from dapo_jax.sampling import SamplingConfig, make_generate

# not kernels: bookkeeping and the control flow whose bodies are counted on their own
_NOT_KERNELS = {"parameter", "constant", "get-tuple-element", "tuple", "bitcast", "while", "conditional", "call",
                "after-all", "opt-barrier", "partition-id", "replica-id", "add-dependency", "domain"}
_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
_HOST = ("infeed", "outfeed", "send", "recv")
_ITEMSIZE = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2, "s32": 4, "u32": 4, "f32": 4,
             "s64": 8, "u64": 8, "f64": 8}


@dataclasses.dataclass
class Instruction:
    opcode: str
    shape: str  # the result type, as printed
    attrs: str  # the rest of the line

    @property
    def bytes(self) -> int:
        """Bytes of the result (a tuple's elements summed)."""
        return sum(_ITEMSIZE.get(t, 4) * math.prod(int(d) for d in dims.split(",") if d)
                   for t, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", self.shape))


def parse_hlo(text: str) -> tuple[str, dict[str, list[Instruction]]]:
    """`(entry name, {computation: instructions})` of an HLO module's text."""
    comps, entry, current = {}, None, None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{\s*$", line)
        if head and not line.startswith(" "):
            current = head.group(2)
            comps[current] = []
            if head.group(1):
                entry = current
            continue
        body = re.match(r"^\s+(?:ROOT )?%?[\w.\-]+ = (.*)$", line)
        if current is None or body is None:
            continue
        rest = body.group(1)
        op = re.search(r"(?<![\w\[])([a-z][a-z0-9\-]*)\(", rest)
        if op is None:
            continue
        comps[current].append(Instruction(op.group(1), rest[:op.start()].strip(), rest[op.end():]))
    return entry, comps


def _called(ins: Instruction) -> list[tuple[str, bool]]:
    """Computations `ins` runs as control flow: `(name, in a loop body)`."""
    if ins.opcode == "while":
        return [(re.search(r"body=%?([\w.\-]+)", ins.attrs).group(1), True),
                (re.search(r"condition=%?([\w.\-]+)", ins.attrs).group(1), True)]
    if ins.opcode == "conditional":
        names = re.findall(r"(?:true_computation|false_computation)=%?([\w.\-]+)", ins.attrs)
        branches = re.search(r"branch_computations=\{([^}]*)\}", ins.attrs)
        if branches:
            names += [n.strip().lstrip("%") for n in branches.group(1).split(",")]
        return [(n, False) for n in names]
    if ins.opcode == "call":
        return [(re.search(r"to_apply=%?([\w.\-]+)", ins.attrs).group(1), False)]
    return []


def analyse(text: str) -> dict:
    """The counts of the module docstring for one compiled program's HLO text."""
    entry, comps = parse_hlo(text)
    kernels = in_loops = copies_in_loops = sorts = 0
    largest_loop_copy = 0
    custom = collections.Counter()
    collectives = collections.Counter()
    largest_collective = 0
    host_in_loops = 0
    seen = set()
    todo = [(entry, False)]
    while todo:
        name, looped = todo.pop()
        if (name, looped) in seen or name not in comps:
            continue
        seen.add((name, looped))
        for ins in comps[name]:
            for callee, loop in _called(ins):
                todo.append((callee, looped or loop))
            if ins.opcode in _NOT_KERNELS or ins.opcode.endswith("-done"):
                continue
            kernels += 1
            in_loops += looped
            sorts += ins.opcode == "sort"
            if ins.opcode == "custom-call":
                target = re.search(r'custom_call_target="([^"]+)"', ins.attrs)
                target = target.group(1) if target else "?"
                custom[target] += 1
                if looped and ("callback" in target or "host" in target.lower()):
                    host_in_loops += 1
            base = ins.opcode.removesuffix("-start")
            if base in _COLLECTIVES:
                collectives[base] += 1
                largest_collective = max(largest_collective, ins.bytes)
            if looped and base in _HOST:
                host_in_loops += 1
            if looped and ins.opcode in ("copy", "copy-start"):
                copies_in_loops += 1
                largest_loop_copy = max(largest_loop_copy, ins.bytes)
    return dict(kernels=kernels, kernels_in_loops=in_loops, custom_calls=dict(custom), collectives=dict(collectives),
                largest_collective_bytes=largest_collective, host_transfers_in_loops=host_in_loops,
                copies_in_loops=copies_in_loops, largest_copy_in_loop_bytes=largest_loop_copy, sorts=sorts)


def compiled_report(lowered) -> dict:
    """`analyse` of a lowered program once compiled, with its `bytes accessed` and FLOPs."""
    compiled = lowered.compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else (cost or {})
    return dict(analyse(compiled.as_text()), bytes_accessed=float(cost.get("bytes accessed", float("nan"))),
                flops=float(cost.get("flops", float("nan"))))


def tiny_config(layers: int, dtype: str = "float32") -> ModelConfig:
    """The Qwen2.5 architecture at `benchmarks.device`'s quick shape (hidden 64, vocab 512), `layers` deep."""
    return ModelConfig.from_hf_dict({**QWEN25_05B, **QUICK_SHAPE, "num_hidden_layers": layers},
                                    param_dtype=dtype, dtype=dtype)


def model_programs(cfg: ModelConfig, *, prompts: int = 2, group: int = 4, prompt_len: int = 16,
                   new_tokens: int = 32) -> dict[str, dict]:
    """`decode step`, `rollout` and `prefill` of a random model of `cfg`, compiled for the default backend."""
    graphdef, state = nnx.split(Decoder(cfg, rngs=nnx.Rngs(0)))
    ids = jnp.ones((prompts, prompt_len), jnp.int32)
    b, slots = prompts * group, new_tokens - 1

    def prefill(state, ids, mask):
        model = nnx.merge(graphdef, state)
        return model(ids, positions_from_mask(mask), mask, cache=KVCache.init(cfg, ids.shape[0], ids.shape[1]))

    def one_step(state, fused, prompt, block, tokens, positions, slot):
        model = nnx.merge(graphdef, state)
        fused = fused or (None,) * len(model.layers)  # none: each block's separate projections
        return decode_step(model, fused, prompt, None, block, tokens, positions, slot)

    _, cache = jax.eval_shape(prefill, state, ids, ids)
    prompt = jax.eval_shape(prompt_cache_from_prefill, cache)
    block = jax.eval_shape(lambda p: empty_response_cache(p, group, slots), prompt)
    rows = jax.ShapeDtypeStruct((b,), jnp.int32)
    fused = jax.eval_shape(lambda state: fused_layers(nnx.merge(graphdef, state)), state)  # outside the loop
    step = jax.jit(one_step, donate_argnums=3).lower(state, fused, prompt, block, rows, rows, jnp.int32(0))
    separate = jax.jit(one_step, donate_argnums=3).lower(state, (), prompt, block, rows, rows, jnp.int32(0))
    sampling = SamplingConfig(max_new_tokens=new_tokens, temperature=1.0, eos_token_ids=(), pad_token_id=0)
    rollout = make_generate(graphdef, sampling, group).lower(state, ids, ids, jax.random.key(0))
    reports = {"decode step": compiled_report(step), "decode step, separate projections": compiled_report(separate),
               "rollout": compiled_report(rollout),
               "prefill": compiled_report(jax.jit(prefill).lower(state, ids, ids))}
    itemsize = jnp.dtype(cfg.dtype).itemsize
    weights = sum(x.size for x in jax.tree.leaves(state)) * itemsize
    kv = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves((prompt.k, prompt.v, block.k, block.v)))
    reports["decode step"].update(weights_bytes=weights, cache_bytes=kv)
    return reports


def update_programs(layers: int, *, topology: str | None = None, packing: bool = True) -> dict[str, dict]:
    """The tiny DAPO recipe's `prepare` and update programs as `dapo-jax plan` lowers them, `layers` deep."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.plan.memory import make_mesh_for, plan_devices
    from dapo_jax.training.plan.model_config import plan_model_config
    from dapo_jax.training.plan.programs import build_world

    cfg = load_config("tiny_dapo", [f"optim.packing={str(packing).lower()}", "data.eval=null"])
    model_cfg, _ = plan_model_config(cfg)
    model_cfg = model_cfg.replace(num_hidden_layers=layers)
    devices, tpu = plan_devices(cfg, topology)
    mesh = make_mesh_for(cfg, devices, "this host" if tpu is None else tpu.name)
    world = build_world(cfg, model_cfg, mesh)
    with jax.set_mesh(mesh):
        return {job.name: compiled_report(job.lower()) for job in world.jobs()
                if job.phase in ("log-prob", "update") and job.bounded_by is None}


def per_layer(deep: dict[str, dict], shallow: dict[str, dict], gap: int) -> dict[str, dict]:
    """Each program's report at the deeper depth, with what one layer adds to its kernel counts."""
    out = {}
    for name, r in deep.items():
        s = shallow.get(name)
        out[name] = dict(r, kernels_per_layer=None if s is None else (r["kernels"] - s["kernels"]) / gap,
                         kernels_in_loops_per_layer=None if s is None else
                         (r["kernels_in_loops"] - s["kernels_in_loops"]) / gap)
    return out


def format_table(reports: dict[str, dict]) -> str:
    lines = ["| program | kernels | per layer | in loops | in loops per layer | custom calls | collectives "
             "| host transfers in loops | largest copy in a loop | sorts | bytes accessed |", "|" + "---|" * 11]
    fmt = lambda x: "n/a" if x is None else f"{x:g}"  # noqa: E731
    for name, r in reports.items():
        calls = ", ".join(f"{k} {v}" for k, v in sorted(r["custom_calls"].items())) or "none"
        coll = ", ".join(f"{k} {v}" for k, v in sorted(r["collectives"].items())) or "none"
        accessed = f"{r['bytes_accessed']:,.0f}"
        if "weights_bytes" in r:
            accessed += f" (weights + cache {r['weights_bytes'] + r['cache_bytes']:,})"
        lines.append(f"| {name} | {r['kernels']} | {fmt(r.get('kernels_per_layer'))} | {r['kernels_in_loops']} | "
                     f"{fmt(r.get('kernels_in_loops_per_layer'))} | {calls} | {coll} | {r['host_transfers_in_loops']} "
                     f"| {r['largest_copy_in_loop_bytes']:,} | {r['sorts']} | {accessed} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--topology", help="compile the update programs for this TPU slice (e.g. v5e-4), deviceless")
    parser.add_argument("--skip-updates", action="store_true", help="only the decode step, rollout and prefill")
    parser.add_argument("--json", help="write every report to this file")
    args = parser.parse_args(argv)
    reports = per_layer(model_programs(tiny_config(4)), model_programs(tiny_config(2)), 2)
    if not args.skip_updates:
        for packing in (True, False):
            deep = update_programs(4, topology=args.topology, packing=packing)
            shallow = update_programs(2, topology=args.topology, packing=packing)
            reports.update(per_layer({(n if packing else f"{n} (unpacked)"): r for n, r in deep.items()},
                                     {(n if packing else f"{n} (unpacked)"): r for n, r in shallow.items()}, 2))
    print(f"backend: {jax.default_backend()} (jax {jax.__version__}); updates compiled for "
          f"{args.topology or 'this host'}; model: the Qwen2.5 architecture, hidden 64, 4 layers")
    print(format_table(reports))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(reports, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
