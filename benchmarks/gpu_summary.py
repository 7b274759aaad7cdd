"""The figures of one `benchmarks/gpu_suite.sh` run as tables, each against its floor from the same run.

    python -m benchmarks.gpu_summary device.jsonl > summary.md

Reads the JSON lines `benchmarks.device` wrote (`--json`) and sets them against the ceilings its `peaks`
phase measured in the same run (a bf16 square matmul, a copy's bytes read + written per second):
- a decode step's floor is the larger of its bytes over the measured bandwidth (the weights and the
  KV cache read once, `device.decode_floor`) and its FLOPs over the measured matmul peak; the step
  over that floor is the gap. "Peak tokens/s" is `sequences / (step FLOPs / matmul peak)`: what the
  batch would decode at if every step ran at the matmul peak.
- an update's MFU is its model FLOPs per second over the data-sheet peak (`training/plan/chips.py`), beside
  the fraction of the measured matmul peak.
The goals of issue 48 are checked on the rows that have them: a decode step at 16 sequences within 2x of
its bandwidth floor, at 1,024 sequences at least 50% of the peak tokens/s, an update at 40% MFU or more.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def load(path: str | Path) -> list[dict]:
    """The JSON lines of a run, in order (a line that does not parse is skipped: a killed writer)."""
    rows = []
    for line in Path(path).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def decode_floors(r: dict, matmul_peak: float, bandwidth: float) -> dict:
    """A decode row against the measured ceilings: floors in ms, the gap, and the peak's tokens/s."""
    bytes_ms = 1e3 * r["step_bytes"] / bandwidth
    flops_ms = 1e3 * r["step_flops"] / matmul_peak
    floor_ms = max(bytes_ms, flops_ms)
    peak_tokens = r["sequences"] / (r["step_flops"] / matmul_peak)
    return dict(bandwidth_floor_ms=bytes_ms, compute_floor_ms=flops_ms, floor_ms=floor_ms,
                gap=r["step_ms"] / floor_ms, peak_tokens_per_s=peak_tokens,
                fraction_of_peak_tokens=r["tokens_per_s"] / peak_tokens)


def summarize(rows: list[dict]) -> str:
    """Markdown: the ceilings, the decode table, the updates, the whole step, the goals, the failures."""
    peaks = next((r for r in rows if r.get("phase") == "peaks" and "error" not in r), None)
    ok = [r for r in rows if "error" not in r]
    out = []
    if peaks is None:
        out.append("No `peaks` row: the decode rows have no measured floor.")
    else:
        out.append(f"Device {peaks['device']}, jax {peaks['jax']}: bf16 matmul "
                   f"{peaks['matmul_peak_flops_per_s'] / 1e12:.1f} TFLOP/s measured, copy "
                   f"{peaks['copy_bytes_per_s'] / 1e9:.0f} GB/s measured (read + written)")
    goals = []
    decode = [r for r in ok if str(r.get("phase", "")).startswith("decode_")]
    if decode and peaks is not None:
        out += ["", "| sequences | new tokens | tokens/s | step ms | bandwidth floor ms | compute floor ms | step / floor "
                "| % of peak tokens/s | compile s | peak memory GiB |", "|" + "---|" * 10]
        for r in sorted(decode, key=lambda r: (r["new_tokens"], r["sequences"])):
            f = decode_floors(r, peaks["matmul_peak_flops_per_s"], peaks["copy_bytes_per_s"])
            out.append(f"| {r['sequences']} | {r['new_tokens']} | {r['tokens_per_s']:,.0f} | {r['step_ms']:.3f} | "
                       f"{f['bandwidth_floor_ms']:.3f} | {f['compute_floor_ms']:.3f} | {f['gap']:.1f}x | "
                       f"{100 * f['fraction_of_peak_tokens']:.1f}% | {r['compile_s']:.1f} | "
                       f"{r['peak_memory_bytes'] / 2**30:.1f} |")
            if r["sequences"] == 16:
                met = r["step_ms"] <= 2 * f["bandwidth_floor_ms"]
                goals.append(f"decode 16 x {r['new_tokens']}: step {r['step_ms']:.3f} ms, "
                             f"{r['step_ms'] / f['bandwidth_floor_ms']:.1f}x its bandwidth floor (goal 2x): "
                             f"{'met' if met else 'not met'}")
            if r["sequences"] == 1024:
                met = f["fraction_of_peak_tokens"] >= 0.5
                goals.append(f"decode 1024 x {r['new_tokens']}: {100 * f['fraction_of_peak_tokens']:.1f}% of the "
                             f"peak tokens/s (goal 50%): {'met' if met else 'not met'}")
    train = [r for r in ok if r.get("phase") == "train"]
    if train:
        out += ["", "| model | step s | sequences | laid-out tokens | TFLOP/s | MFU | % of measured matmul | peak memory GiB |",
                "|" + "---|" * 8]
        for r in train:
            mfu = "n/a" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            out.append(f"| {r['model']} | {r['step_s']:.3f} | {r['sequences']} | {r['laid_out_tokens']:,} | "
                       f"{r['flops_per_s'] / 1e12:.1f} | {mfu} | {100 * r['fraction_of_measured_peak']:.1f}% | "
                       f"{r['peak_memory_bytes'] / 2**30:.1f} |")
            if r["mfu"] is not None:
                goals.append(f"update {r['model']}: MFU {100 * r['mfu']:.1f}% (goal 40%): "
                             f"{'met' if r['mfu'] >= 0.4 else 'not met'}")
    for r in (r for r in ok if r.get("phase") == "dapo_step"):
        out += ["", f"DAPO step ({r['model']}): {r['step_s']:.2f} s = rollout {r['rollout_s']:.2f} s "
                f"({r['gen_sequences']} x {r['new_tokens']} tokens, {r['rollout_tokens_per_s']:,.0f} tokens/s) "
                f"+ log pi_old {r['old_logp_s']:.2f} s + {r['train_sequences']}-sequence updates {r['update_s']:.2f} s; "
                f"first step {r['first_step_s']:.1f} s"]
    if goals:
        out += ["", "Goals (issue 48):"] + [f"- {g}" for g in goals]
    failed = [r for r in rows if "error" in r]
    if failed:
        out += ["", "Failed:"] + [f"- {r.get('phase')} ({r.get('sequences', '?')} sequences, {r.get('model', '?')}): "
                                  f"{r['error'][-300:]}" for r in failed]
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m benchmarks.gpu_summary device.jsonl", file=sys.stderr)
        return 2
    path = Path(argv[0])
    if not path.is_file():
        print(f"benchmarks.gpu_summary: {path}: no such file", file=sys.stderr)
        return 2
    print(summarize(load(path)), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
