"""What `dapo-jax plan` prints: the per-device table by phase, the programs, the estimate and the verdict;
and the same as JSON (every figure in bytes)."""

from __future__ import annotations

import dataclasses

from dapo_jax.training.plan.memory import Plan
from dapo_jax.training.plan.compile import GiB


def gib(x: int | float) -> str:
    return f"{x / GiB:.2f}"


def human(x: int) -> str:
    """Bytes in the largest unit that keeps a figure >= 1: `12.3 MiB`."""
    for unit, size in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(x) >= size:
            return f"{x / size:.2f} {unit}"
    return f"{x} B"


def count(n: int) -> str:
    """`32.76B`, `494.0M`, `105.6k`."""
    for unit, size in (("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.{2 if unit == 'B' else 1}f}{unit}"
    return str(n)


def verdict_lines(plan: Plan) -> list[str]:
    """The verdict: one line if it fits, one per phase that does not (in GiB, or MiB below 1 GiB)."""
    cap = f"the chip has {gib(plan.capacity)} GiB" if plan.capacity else "capacity unknown"
    if plan.fits:
        room = f", {human(plan.capacity - plan.peak)} to spare of {human(plan.capacity)}" if plan.capacity else ""
        lines = [f"VERDICT: fits: peak {human(plan.peak)} per device ({plan.peak_phase}){room}"]
        for phase, worst in plan.uncertain():
            lines.append(f"  but {phase.name} is extrapolated from fewer layers: with its temporaries as far under the "
                         f"truth as that line has been measured, it would need {gib(worst)} GiB, over the chip's "
                         f"{gib(plan.capacity)}; --exact --only '{phase.name}' compiles it whole")
        return lines
    lines = ["VERDICT: does not fit"]
    for phase in plan.over():
        lines.append(f"  {phase.name} does not fit: needs {gib(phase.total)} GiB per device, {cap}"
                     + (" (the TPU compiler refused it)" if phase.refused else ""))
    return lines


def format_plan(plan: Plan, *, title: str = "") -> str:
    """The report (every figure also in `plan_dict`, in bytes)."""
    mesh = " x ".join(f"{k} {v}" for k, v in plan.mesh.items())
    compiled = [p for p in plan.programs if not p.cached]
    unit, size = next((u, b) for u, b in (("GiB", GiB), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
                      if plan.peak >= b or u == "B")
    val = lambda x: f"{x / size:.2f}" if x != "" else ""  # noqa: E731
    lines = [
        f"dapo-jax plan{': ' + title if title else ''} on {plan.target}, mesh {mesh}",
        f"model: {count(plan.num_params)} parameters, {plan.layers} layers ({plan.model_source})",
        f"compiled {len(compiled)} program(s) in {plan.compile_s:.0f} s, {len(plan.programs) - len(compiled)} from "
        f"the cache ({plan.versions})",
        *[f"note: {n}" for n in plan.notes],
        f"capacity: {gib(plan.capacity) + ' GiB per device' if plan.capacity else 'unknown'} ({plan.capacity_source})",
        "",
        f"per device, {unit}",
    ]
    names = [p.name for p in plan.phases]
    widths = [max(12, len(n) + 2) for n in names]
    row = lambda label, values: f"  {label:<28}" + "".join(f"{v:>{w}}" for v, w in zip(values, widths))  # noqa: E731
    lines.append(row("", names))
    for label, value in plan.resident.items():
        if value or label in ("parameters", "optimizer state"):
            lines.append(row(label, [val(value)] * len(names)))
    overlap = next((p for p in plan.phases if p.name == "update + overlapped rollout"), None)
    for label in ("inputs", "outputs (not donated)", "temporaries", "held beside it"):
        vals = [p.added.get(label, 0) if p is not overlap else
                p.added.get(f"update {label}", 0) + p.added.get(f"rollout {label}", 0) for p in plan.phases]
        if any(vals):
            lines.append(row(label, [val(v) for v in vals]))
    if overlap is not None:
        lines.append(row("parameters copy (overlap)", [val(p.added.get("parameters copy for the rollout", 0))
                                                       for p in plan.phases]))
    if "rollout" in names:
        lines.append(row("  of which KV cache", [val(plan.kv_cache) if n == "rollout" else "" for n in names]))
    lines.append(row("total", [val(p.total) for p in plan.phases]))
    over = {p.name for p in plan.over()}
    lines.append(row("", ["OVER" if n in over else "fits" for n in names]))
    lines += ["", f"programs (per device, {unit}; a refused program: its arguments and what the compiler said it "
              "required)"]
    lines.append(f"  {'program':<26}{'args':>9}{'outputs':>9}{'donated':>9}{'temps':>9}{'compile':>9}  attention; shape")
    for p in plan.programs:
        f = p.figures
        when, at = ("cached" if p.cached else f"{p.compile_s:.0f} s"), ""
        if p.bounded_by:
            when, at = "-", f" [at most {p.bounded_by}'s: not compiled]"
        elif p.extrapolated:
            at = f" [compiled at {'+'.join(map(str, p.layers))} layers]"
        lines.append(f"  {p.name:<26}{val(f.arguments):>9}{val(f.outputs):>9}{val(f.aliased):>9}{val(f.temporaries):>9}"
                     f"{when:>9}  {p.attention + '; ' if p.attention else ''}{p.shape}{at}"
                     + ("  REFUSED" if f.refused else ""))
    if plan.estimate:
        lines += [""] + estimate_lines(plan.estimate)
    lines += [""] + verdict_lines(plan)
    return "\n".join(lines)


def estimate_lines(est: dict) -> list[str]:
    if "seconds" not in est:
        return [est.get("note", "")]
    parts = ", ".join(f"{k} {v:.1f} s" for k, v in est["seconds"].items())
    return [
        "ESTIMATED step time (counted from the config, not measured):",
        f"  {parts}: step {est['step_s']:.1f} s; {est['tokens_per_s_per_chip']:,.0f} tokens/s per chip "
        f"(generation {est['generated_tokens_per_s_per_chip']:,.0f} tokens/s per chip; a decode step "
        f"{est['rollout_decode_step_ms']:.1f} ms, bound by {est['decode_bound']})",
        *[f"  assuming {a}" for a in est["assumptions"]],
    ]


def plan_dict(plan: Plan) -> dict:
    """The plan as JSON-able numbers (bytes, seconds)."""
    out = dataclasses.asdict(plan)
    out.update(resident_total=plan.resident_total, peak=plan.peak, peak_phase=plan.peak_phase, fits=plan.fits,
               compile_s=plan.compile_s, over=[p.name for p in plan.over()], verdict=verdict_lines(plan),
               uncertain={phase.name: worst for phase, worst in plan.uncertain()})
    for p, d in zip(plan.programs, out["programs"]):
        d["added"] = p.figures.added
    return out


__all__ = ["estimate_lines", "format_plan", "gib", "human", "plan_dict", "verdict_lines"]
