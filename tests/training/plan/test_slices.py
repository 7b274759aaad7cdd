"""TPU slices by name (training/plan/slices.py): the table against the facts it claims, and against libtpu itself."""

import importlib.util
import re

import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.plan.slices import CHIPS, parse_family, parse_slice, slices_of, topology_devices, valid_names

needs_libtpu = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                  reason="libtpu is not installed (pip install 'dapo_jax[tpu]')")


@pytest.mark.parametrize("name, topology, chips, devices, kind", [
    ("v4-8", "v4:2x2x1", 4, 4, "megacore"),
    ("v4-128", "v4:4x4x4", 64, 64, "megacore"),
    ("v5e-4", "v5e:2x2", 4, 4, None),
    ("v5litepod-16", "v5e:4x4", 16, 16, None),
    ("v5e-256", "v5e:16x16", 256, 256, None),
    ("v5p-8", "v5:2x2x1", 4, 4, "megacore"),
    ("v5p-64", "v5:2x4x4", 32, 32, "megacore"),
    ("v5p-1024", "v5:8x8x8", 512, 512, "megacore"),
    ("v6e-8", "v6e:2x4", 8, 8, None),
    ("tpu7x-8", "tpu7x:2x2x1", 4, 8, None),  # Ironwood: two TensorCores a chip, each a device
])
def test_names_map_to_libtpu_arguments(name, topology, chips, devices, kind):
    s = parse_slice(name)
    assert (s.topology, s.chips, s.devices) == (topology, chips, devices)
    assert s.topology_kwargs().get("chip_config_name") == kind
    assert s.topology_kwargs()["num_slices"] == 1


def test_multislice_and_aliases():
    s = parse_slice("2xv5p-64")
    assert (s.name, s.num_slices, s.chips, s.devices, s.total_chips) == ("2xv5p-64", 2, 32, 64, 64)
    assert s.topology_kwargs()["num_slices"] == 2
    assert parse_slice("V5LitePod-4").name == "v5e-4" and parse_slice("v5litepod-4").topology == "v5e:2x2"
    assert parse_family("v5litepod") is CHIPS["v5e"] and parse_family("v5p") is CHIPS["v5p"]
    assert parse_family("v5p-64") is None
    assert [s.name for s in slices_of(CHIPS["v5e"])][:3] == ["v5e-1", "v5e-4", "v5e-8"]


@pytest.mark.parametrize("bad", ["v5p-7", "v5p-3", "v9-8", "h100-8", "v5e", "v5e-2", "0xv5p-8", "v5p64"])
def test_unknown_name_is_one_line_listing_the_valid_ones(bad):
    with pytest.raises(ConfigError) as e:
        parse_slice(bad)
    msg = str(e.value)
    assert "\n" not in msg and bad in msg
    for example in ("v4-8", "v5e-4", "v5p-64", "v6e-256", "tpu7x-8"):
        assert re.search(rf"\b{example.split('-')[0]}-\{{[^}}]*\b{example.split('-')[1]}\b", msg), example


def test_table_figures_are_the_published_ones():
    """Google Cloud's TPU pages: bf16 peak (TFLOP/s), HBM (GiB) and bandwidth (GB/s) per chip."""
    published = {"v4": (275, 32, 1200), "v5e": (197, 16, 819), "v5p": (459, 95, 2765), "v6e": (918, 32, 1638),
                 "tpu7x": (2307, 192, 7380)}
    for family, (tflops, hbm, bw) in published.items():
        c = CHIPS[family]
        assert (c.bf16_tflops, c.hbm_gib, c.hbm_gbps) == (tflops, hbm, bw) and c.source.startswith("https://")
    assert len(valid_names()) == sum(len(c.shapes) for c in CHIPS.values())


@needs_libtpu
@pytest.mark.parametrize("name, kind", [("v5e-4", "TPU v5 lite"), ("v5p-16", "TPU v5"), ("v4-8", "TPU v4"),
                                        ("v6e-8", "TPU v6 lite"), ("tpu7x-8", "TPU7x"), ("2xv5e-4", "TPU v5 lite")])
def test_libtpu_builds_every_kind_of_slice(name, kind):
    s = parse_slice(name)
    devices = topology_devices(s)
    assert len(devices) == s.devices and devices[0].device_kind == kind and devices[0].platform == "tpu"


@needs_libtpu
def test_usable_hbm_is_what_the_compiler_refuses_past():
    """A real refusal: a v5e program that needs more than a chip; its message parsed to the table's usable HBM."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec

    from dapo_jax.training.plan.compile import parse_refusal

    devices = topology_devices(parse_slice("v5e-1"))
    mesh = jax.make_mesh((1,), ("x",), devices=devices)
    n = 48_000  # a 9.2 GB matrix: two such temporaries alive at once (the compiler checks temporaries only)
    big = jax.ShapeDtypeStruct((n, n), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))

    def two_temporaries(a):
        b = a @ a
        return (b @ a) + b

    with pytest.raises(Exception) as e:  # noqa: PT011 - XLA's JaxRuntimeError
        jax.jit(two_temporaries).lower(big).compile()
    required, available = parse_refusal(str(e.value))
    assert available == int(CHIPS["v5e"].usable_gib * 2**30)
    assert required > available and required >= 2 * n * n * 4


def test_missing_libtpu_is_one_line_with_the_install_command(monkeypatch):
    from dapo_jax.training.plan import slices

    monkeypatch.setattr(slices, "libtpu_available", lambda: False)
    with pytest.raises(ConfigError, match=r"pip install 'dapo_jax\[tpu\]'") as e:
        slices.topology_devices(parse_slice("v5p-8"))
    assert "\n" not in str(e.value)
