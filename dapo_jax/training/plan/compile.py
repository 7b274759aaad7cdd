"""Compiling one program for the plan: its per-device bytes, the compiler's refusal read, a per-layer
extrapolation, and a cache of what was compiled.

    figures, seconds, cached = measure(lambda: fn.lower(*abstract_args), target=..., resident=..., cache=...)
    full = extrapolate(f2, f3, 2, 3, 64)        # exact for a program whose layers run as one lax.scan

XLA's `memory_analysis()` of a compiled SPMD program is per device: its arguments, outputs, the
temporaries it allocates (activations, gradients, the KV cache, every other buffer) and the output
bytes that reuse a donated argument. A TPU program that cannot fit is refused at compile time with
`RESOURCE_EXHAUSTED: ... the total memory required for HLO temporaries (X G) exceeds available HBM
(Y G)` (or `Used X of Y hbm`); `parse_refusal` reads X and Y (XLA prints binary units: G = GiB) and
the program's figures are then its arguments and outputs from their abstract shapes, and X.

Why a per-layer extrapolation is exact for a scan: a program whose L layers run as one `lax.scan`
over stacked weights (models/decoder.py, `Decoder._scan_layers`) holds L layers' weights, their
gradients and optimizer moments, and with remat one saved input per layer: every per-layer buffer
grows by the same bytes per layer, and the scan body's own temporaries are allocated once whatever L.
So each figure is `a + b L`: two compiles (2 and 3 layers) give a and b. The unrolled programs
(the sampler's prefill and decode, which carry a KV cache per layer) follow no line by construction:
the compiler's peak can move to another point of the program as layers are added. Against whole
compiles (docs/long_context.md), a Qwen2.5-7B rollout's line on v5p-32 was 4.5% high at 28 layers and
20,480 tokens, and 41% low at 8 layers and 2,048 tokens, where buffers that do not grow with the layers
set the peak at 2 and 3; Qwen2.5-0.5B's on v5e-8 at 20,480 tokens was 8.7% low (rollout) and 28% high
(evaluation rollout). Compiling them whole is `--exact`; by default it is not, because at 64 layers
(DAPO's 32B recipe) two such compiles at once outgrew a 24 GiB machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import re
import time
from importlib import metadata
from pathlib import Path
from typing import Callable

import jax
import jax.numpy as jnp

GiB = 2**30
_UNITS = {"": 1, "B": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}
_REFUSALS = (
    re.compile(r"required for HLO temporaries \(([\d.]+)\s*([KMGTP]?)i?B?\) exceeds available HBM \(([\d.]+)\s*([KMGTP]?)i?B?\)"),
    re.compile(r"Used ([\d.]+)\s*([KMGTP]?)i?B? of ([\d.]+)\s*([KMGTP]?)i?B? hbm"),
)


class PlanCompileError(RuntimeError):
    """The compiler failed on a program for a reason other than memory (one line)."""


def parse_refusal(message: str) -> tuple[int, int] | None:
    """`(required, available)` bytes from a compiler's out-of-memory refusal, or None if `message` is not one."""
    if "RESOURCE_EXHAUSTED" not in message and "Ran out of memory" not in message:
        return None
    for pattern in _REFUSALS:
        m = pattern.search(message)
        if m:
            return (int(float(m.group(1)) * _UNITS[m.group(2)]), int(float(m.group(3)) * _UNITS[m.group(4)]))
    return None


def shard_bytes(tree) -> int:
    """Bytes per device of a tree of `ShapeDtypeStruct`s / arrays: each leaf's shard under its sharding
    (a leaf without a named sharding counts whole)."""
    total = 0
    for leaf in jax.tree.leaves(tree):
        shape = tuple(leaf.shape)
        sharding = getattr(leaf, "sharding", None)
        sharding = getattr(sharding, "sharding", sharding)  # an OutInfo's Format
        if sharding is not None and hasattr(sharding, "shard_shape"):
            shape = sharding.shard_shape(shape)
        total += math.prod(shape) * jnp.dtype(leaf.dtype).itemsize
    return total


_INT_FIELDS = ("arguments", "outputs", "temporaries", "aliased", "code", "resident_args", "held")


@dataclasses.dataclass
class Figures:
    """One program's per-device bytes. `resident_args`: the part of its arguments that is the run's resident
    state (parameters, optimizer state, reference, critic), counted once in the phase; `held`: buffers alive
    beside it that are not its arguments (the packed update's whole batch)."""

    arguments: int
    outputs: int
    temporaries: int
    aliased: int
    code: int = 0
    resident_args: int = 0
    held: int = 0
    refused: str | None = None  # the compiler's refusal (then temporaries = what it said it required)
    available: int | None = None  # the HBM the compiler said it had, from a refusal

    @property
    def added(self) -> int:
        """What the program adds to the resident state while it runs."""
        return self.arguments - self.resident_args + self.outputs - self.aliased + self.temporaries + self.held

    @classmethod
    def of(cls, compiled, *, resident_args: int = 0, held: int = 0) -> "Figures":
        m = compiled.memory_analysis()
        return cls(int(m.argument_size_in_bytes), int(m.output_size_in_bytes), int(m.temp_size_in_bytes),
                   int(m.alias_size_in_bytes), int(m.generated_code_size_in_bytes), resident_args, held)


def extrapolate(f0: Figures, f1: Figures, l0: int, l1: int, layers: int) -> Figures:
    """Each figure on the line through `(l0, f0)` and `(l1, f1)`, at `layers`."""
    def line(a: int, b: int) -> int:
        return max(0, round(a + (b - a) * (layers - l0) / (l1 - l0)))

    avail = f1.available or f0.available
    return Figures(**{k: line(getattr(f0, k), getattr(f1, k)) for k in _INT_FIELDS},
                   refused=f1.refused or f0.refused, available=avail)


def package_versions() -> str:
    out = [f"jax {jax.__version__}"]
    for name in ("jaxlib", "libtpu"):
        try:
            out.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(out)


def cache_dir() -> Path | None:
    """Where compiled programs' figures are kept (`DAPO_JAX_PLAN_CACHE`; "" = no cache)."""
    path = os.environ.get("DAPO_JAX_PLAN_CACHE")
    if path == "":
        return None
    return Path(path or Path.home() / ".cache" / "dapo_jax" / "plan")


@dataclasses.dataclass
class Measurement:
    """A lowered program on its way to its figures: `run()` compiles it (or reads the cache)."""

    lowered: object
    key: str
    file: Path | None
    kept_bytes: int
    resident_args: int
    held: int

    def cached(self) -> Figures | None:
        if self.file is None or not self.file.exists():
            return None
        try:
            data = json.loads(self.file.read_text())
            data.pop("compile_s", None)
            return Figures(**data, resident_args=self.resident_args, held=self.held)
        except (ValueError, TypeError):
            return None  # a stale or broken entry: compile again

    def cached_seconds(self) -> float:
        try:
            return float(json.loads(self.file.read_text()).get("compile_s", 0.0))
        except (OSError, ValueError, AttributeError):
            return 0.0

    def run(self) -> tuple[Figures, float, bool]:
        """`(figures, compile seconds, from cache)`; a refusal for lack of memory is an answer, any other
        compiler failure a `PlanCompileError`."""
        hit = self.cached()
        if hit is not None:
            return hit, self.cached_seconds(), True
        t0 = time.perf_counter()
        try:
            figures = Figures.of(self.lowered.compile(), resident_args=self.resident_args, held=self.held)
        except Exception as e:  # noqa: BLE001 - XLA raises JaxRuntimeError; only its out-of-memory refusal is an answer
            refusal = parse_refusal(str(e))
            if refusal is None:
                first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                raise PlanCompileError(first[:500]) from e
            required, available = refusal
            figures = Figures(self.kept_bytes, shard_bytes(self.lowered.out_info), required, 0,
                              resident_args=self.resident_args, held=self.held, refused=_one_line(str(e)),
                              available=available)
        seconds = time.perf_counter() - t0
        if self.file is not None:
            try:
                self.file.parent.mkdir(parents=True, exist_ok=True)
                data = {k: v for k, v in dataclasses.asdict(figures).items() if k not in ("resident_args", "held")}
                self.file.write_text(json.dumps({**data, "compile_s": seconds}))
            except OSError:
                pass  # a read-only home: plan without a cache
        return figures, seconds, False


def lower_for(lower: Callable, *, target: str, args=(), resident=(), held: int = 0,
              cache: Path | None = None) -> Measurement:
    """Lowers a program (`lower()` gives its `jax.stages.Lowered`) for `Measurement.run` to compile.

    target: the devices and compiler it is for (slice, device kind, versions): with the program's text it
    keys the cache, so a program compiles once per target whatever plan asks for it. args: its abstract
    arguments as lowered (`(args, kwargs)`); resident: the subtrees of them that are resident state. Only
    the arguments the program keeps count (jit drops unused ones)."""
    lowered = lower()
    flat = jax.tree.leaves(args)
    kept = _kept(lowered, len(flat))
    ids = {id(x) for x in jax.tree.leaves(resident)}
    resident_args = sum(shard_bytes(x) for i, x in enumerate(flat) if i in kept and id(x) in ids)
    kept_bytes = sum(shard_bytes(x) for i, x in enumerate(flat) if i in kept)
    key = hashlib.sha256((target + "\n" + lowered.as_text()).encode()).hexdigest()[:32]
    return Measurement(lowered, key, cache / f"{key}.json" if cache is not None else None, kept_bytes,
                       resident_args, held)


def measure(lower: Callable, **kwargs) -> tuple[Figures, float, bool]:
    """`lower_for(lower, **kwargs).run()`: one program's `(figures, compile seconds, from cache)`."""
    return lower_for(lower, **kwargs).run()


def _kept(lowered, n: int) -> set[int]:
    """Indices of the flat arguments the lowered program keeps (all of them if JAX does not say)."""
    try:
        kept = lowered._lowering.compile_args["kept_var_idx"]
        return set(kept) if kept is not None else set(range(n))
    except (AttributeError, KeyError, TypeError):
        return set(range(n))


def _one_line(message: str) -> str:
    for line in message.splitlines():
        if "RESOURCE_EXHAUSTED" in line or "Ran out of memory" in line or "exceeds" in line:
            return line.strip()[:300]
    return message.strip().splitlines()[0][:300]


__all__ = ["Figures", "Measurement", "PlanCompileError", "cache_dir", "extrapolate", "lower_for", "measure", "package_versions", "parse_refusal",
           "shard_bytes"]
