"""What one local accelerator can do, by JAX's `device_kind`: for the step-time estimate of a plan made
on the machine itself (no `--topology`) and for `benchmarks/device.py`'s MFU.

    chip = chip_for("NVIDIA H100 80GB HBM3")     # slices.Chip: 989 TFLOP/s bf16, 3,350 GB/s, 80 GiB
    chip_for("cpu")                             # None: no peak to count against

| `device_kind` contains | GPU | bf16 dense peak | HBM bandwidth | memory |
|---|---|---|---|---|
| H100 PCIe | H100 PCIe | 756 TFLOP/s | 2,000 GB/s | 80 GB |
| H100 | H100 SXM | 989 TFLOP/s | 3,350 GB/s | 80 GB |
| H200 | H200 SXM | 989 TFLOP/s | 4,800 GB/s | 141 GB |
| A100-SXM4-80GB | A100 SXM 80GB | 312 TFLOP/s | 2,039 GB/s | 80 GB |
| A100 80GB PCIe | A100 PCIe 80GB | 312 TFLOP/s | 1,935 GB/s | 80 GB |
| A100 | A100 40GB | 312 TFLOP/s | 1,555 GB/s | 40 GB |
| L4 | L4 | 121 TFLOP/s | 300 GB/s | 24 GB |

Sources: NVIDIA's data sheets (nvidia.com/en-us/data-center/h100, /h200, /a100, /l4), the dense figures
(the sheets' headline bf16 numbers are with 2:4 sparsity, twice these). The first row whose key the
device kind contains wins, so the PCIe H100 comes before the SXM one. TPU device kinds ("TPU v5 lite",
"TPU v5", "TPU v6 lite", "TPU v4") map to `slices.CHIPS`, whose table has its own sources.
"""

from __future__ import annotations

from dapo_jax.training.plan.slices import CHIPS, Chip

_SHEETS = "https://www.nvidia.com/en-us/data-center/"


def _gpu(family: str, tflops: float, gbps: float, gib: float, sheet: str) -> Chip:
    return Chip(family, libtpu="", counts="chips", chip_config=None, devices_per_chip=1, hbm_gib=gib,
                bf16_tflops=tflops, hbm_gbps=gbps, usable_gib=None, source=_SHEETS + sheet, shapes={})


GPUS: tuple[tuple[str, Chip], ...] = (
    ("H100 PCIe", _gpu("H100 PCIe", 756, 2000, 80, "h100")),
    ("H100", _gpu("H100 SXM", 989, 3350, 80, "h100")),
    ("H200", _gpu("H200 SXM", 989, 4800, 141, "h200")),
    ("A100-SXM4-80GB", _gpu("A100 SXM 80GB", 312, 2039, 80, "a100")),
    ("A100 80GB PCIe", _gpu("A100 PCIe 80GB", 312, 1935, 80, "a100")),
    ("A100", _gpu("A100 40GB", 312, 1555, 40, "a100")),
    ("L4", _gpu("L4", 121, 300, 24, "l4")),
)
TPUS: tuple[tuple[str, str], ...] = (("TPU v5 lite", "v5e"), ("TPU v6 lite", "v6e"), ("TPU v5", "v5p"), ("TPU v4", "v4"))


def chip_for(device_kind: str) -> Chip | None:
    """The Chip whose key `device_kind` contains (the module's table), or None (a CPU, an unknown card)."""
    for key, chip in GPUS:
        if key in device_kind:
            return chip
    for key, family in TPUS:
        if key in device_kind:
            return CHIPS[family]
    return None


__all__ = ["GPUS", "TPUS", "chip_for"]
