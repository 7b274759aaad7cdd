"""training/plan/chips.py: JAX's device kinds mapped to the data-sheet figures the estimate and the MFU use."""

import pytest

from dapo_jax.training.plan.chips import GPUS, chip_for
from dapo_jax.training.plan.slices import CHIPS


@pytest.mark.parametrize("kind, family, tflops, gbps", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989, 3350),  # what jax 0.11.2 reported on an H100 SXM
    ("NVIDIA H100 PCIe", "H100 PCIe", 756, 2000),  # the PCIe card before the SXM row that would also match
    ("NVIDIA H200", "H200 SXM", 989, 4800),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB", 312, 2039),
    ("NVIDIA A100-SXM4-40GB", "A100 40GB", 312, 1555),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe 80GB", 312, 1935),
    ("NVIDIA L4", "L4", 121, 300),
])
def test_gpus_by_device_kind(kind, family, tflops, gbps):
    chip = chip_for(kind)
    assert (chip.family, chip.bf16_tflops, chip.hbm_gbps, chip.devices_per_chip) == (family, tflops, gbps, 1)
    assert chip.source.startswith("https://www.nvidia.com/")


@pytest.mark.parametrize("kind, family", [("TPU v5 lite", "v5e"), ("TPU v5", "v5p"), ("TPU v6 lite", "v6e"),
                                          ("TPU v4", "v4")])
def test_tpu_device_kinds_are_the_slice_tables_chips(kind, family):
    assert chip_for(kind) is CHIPS[family]


def test_a_cpu_or_an_unknown_card_has_none():
    assert chip_for("cpu") is None and chip_for("Some Future Accelerator") is None
    assert len({chip.family for _, chip in GPUS}) == len(GPUS)
