"""TPU slices by the names users give them (`v5p-64`, `v5litepod-16`, `2xv6e-256`), for `dapo-jax plan`.

    s = parse_slice("v5p-64")           # Slice: 32 chips, libtpu topology "v5:2x4x4" (megacore), 32 devices
    devices = topology_devices(s)       # compile-only devices (libtpu), no TPU needed

One table, `CHIPS`, holds what the plan needs to know of each TPU generation, with its source:

| family (aliases) | "-N" counts | libtpu name | chip config | devices per chip | HBM per chip | bf16 peak per chip | HBM bandwidth per chip |
|---|---|---|---|---|---|---|---|
| v4 | TensorCores (2 a chip) | `v4:AxBxC` | megacore | 1 | 32 GiB | 275 TFLOP/s | 1,200 GB/s |
| v5e (v5litepod) | chips | `v5e:AxB` | default | 1 | 16 GiB | 197 TFLOP/s | 819 GB/s |
| v5p | TensorCores (2 a chip) | `v5:AxBxC` | megacore | 1 | 95 GiB | 459 TFLOP/s | 2,765 GB/s |
| v6e | chips | `v6e:AxB` | default | 1 | 32 GiB | 918 TFLOP/s | 1,638 GB/s |
| tpu7x | TensorCores (2 a chip) | `tpu7x:AxBxC` | default | 2 | 192 GiB | 2,307 TFLOP/s | 7,380 GB/s |

Sources: Google Cloud's TPU system architecture pages (cloud.google.com/tpu/docs/v4, /v5e, /v5p,
/v6e, /tpu7x: "Peak compute per chip (bf16)", "HBM capacity", "HBM bandwidth"); the name -> topology
mapping follows MaxText's `accelerator_to_spec_map.py` (AI-Hypercomputer/maxtext). The "-N" of v4,
v5p and tpu7x counts TensorCores: a v5p-64 is 32 chips, each one JAX device (megacore); a tpu7x-8 is 4
chips of 2 devices each. v5e and v6e count chips. `2xv5p-64` is two such slices (`num_slices=2`), joined
by the data-centre network.

What the TPU compiler will let a program use is a little less than the HBM: it reserves some for
itself and refuses a program over the rest (`RESOURCE_EXHAUSTED ... exceeds available HBM (Y G)`).
`usable_gib` is that Y as libtpu 0.0.42.1 reports it per device (measured here by compiling a program
that cannot fit; `tests/training/plan/test_slices.py` checks it for v5e); the plan compares against it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import os
import re
import sys
import tempfile

from dapo_jax.startup import quiet_libtpu, tpu_visible
from dapo_jax.training.config.base import ConfigError

GiB = 2**30
INSTALL = "pip install 'dapo_jax[tpu]'  (libtpu for jax 0.10.2, i.e. pip install 'jax[tpu]==0.10.2')"


@dataclasses.dataclass(frozen=True)
class Chip:
    """One TPU generation: how libtpu names it and what one chip has (see the module's table)."""

    family: str
    libtpu: str  # topology_name prefix, e.g. "v5" for v5p
    counts: str  # what the N of "family-N" counts: "chips" or "cores" (TensorCores, 2 a chip)
    chip_config: str | None  # libtpu's chip_config_name ("megacore": both TensorCores as one device)
    devices_per_chip: int
    hbm_gib: float  # HBM per chip
    bf16_tflops: float  # peak per chip
    hbm_gbps: float  # HBM bandwidth per chip, GB/s
    usable_gib: float | None  # per device, what the compiler lets a program use (None: not measured)
    source: str
    shapes: dict  # chips -> topology "AxB" / "AxBxC"

    @property
    def device_flops(self) -> float:
        """One JAX device's bf16 peak, FLOP/s (a chip's shared by its devices)."""
        return self.bf16_tflops * 1e12 / self.devices_per_chip

    @property
    def device_bandwidth(self) -> float:
        """One JAX device's HBM bandwidth, bytes/s."""
        return self.hbm_gbps * 1e9 / self.devices_per_chip

    @property
    def names(self) -> list[str]:
        per = 2 if self.counts == "cores" else 1
        return [f"{self.family}-{chips * per}" for chips in self.shapes]


_3D = {1: "1x1x1", 4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
       512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}
_DOCS = "https://cloud.google.com/tpu/docs/"

CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", "v4", "cores", "megacore", 1, 32, 275, 1200, None, _DOCS + "v4",
               {k: v for k, v in _3D.items() if 4 <= k <= 2048}),
    "v5e": Chip("v5e", "v5e", "chips", None, 1, 16, 197, 819, 15.75, _DOCS + "v5e", _2D),
    "v5p": Chip("v5p", "v5", "cores", "megacore", 1, 95, 459, 2765, 95.74, _DOCS + "v5p",
                {**{k: v for k, v in _3D.items() if k >= 4}, 3072: "12x16x16", 6144: "16x16x24"}),
    "v6e": Chip("v6e", "v6e", "chips", None, 1, 32, 918, 1638, None, _DOCS + "v6e", _2D),
    "tpu7x": Chip("tpu7x", "tpu7x", "cores", None, 2, 192, 2307, 7380, None, _DOCS + "tpu7x",
                  {k: v for k, v in _3D.items() if k <= 2048}),
}
ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v7x": "tpu7x"}


@dataclasses.dataclass(frozen=True)
class Slice:
    """A named slice (or `num_slices` of them) and the arguments libtpu's `get_topology_desc` takes."""

    name: str
    chip: Chip
    chips: int  # per slice
    num_slices: int = 1

    @property
    def topology(self) -> str:
        return f"{self.chip.libtpu}:{self.chip.shapes[self.chips]}"

    @property
    def devices(self) -> int:
        return self.chips * self.chip.devices_per_chip * self.num_slices

    @property
    def total_chips(self) -> int:
        return self.chips * self.num_slices

    def topology_kwargs(self) -> dict:
        """`get_topology_desc(topology_name=self.topology, platform="tpu", **kwargs)`, as MaxText passes them:
        hosts of 2x2 chips (1 chip for a one-chip slice), wrap-around links on dimensions of 4 chips or more
        on the 3D tori (v4, v5p, tpu7x) and on the 16-chip rows of v5e / v6e."""
        dims = [int(d) for d in self.chip.shapes[self.chips].split("x")]
        kw = {"chips_per_host_bounds": (1, 1, 1) if self.chips == 1 else (2, 2, 1), "num_slices": self.num_slices}
        if self.chip.chip_config:
            kw["chip_config_name"] = self.chip.chip_config
        if len(dims) == 3:
            kw["wrap"] = (all(d >= 4 for d in dims),) * 3
        else:
            kw["wrap"] = (dims[0] >= 16, dims[1] >= 16, False)
        return kw

    @property
    def hbm_per_device(self) -> int:
        """Bytes a program may use on one device: the compiler's usable figure, else the HBM's share."""
        gib = self.chip.usable_gib or self.chip.hbm_gib / self.chip.devices_per_chip
        return int(gib * GiB)

    @property
    def capacity_source(self) -> str:
        if self.chip.usable_gib:
            return f"{self.chip.family} usable HBM per device as libtpu reports it ({self.chip.hbm_gib:g} GiB a chip)"
        return f"{self.chip.family} HBM {self.chip.hbm_gib:g} GiB a chip / {self.chip.devices_per_chip} device(s) ({self.chip.source})"


def valid_names() -> list[str]:
    return [n for chip in CHIPS.values() for n in chip.names]


def _family(name: str) -> Chip | None:
    name = ALIASES.get(name, name)
    return CHIPS.get(name)


def parse_family(text: str) -> Chip | None:
    """`v5p` -> the v5p Chip (for `--search`); None when `text` names a slice or nothing known."""
    return _family(text.strip().lower())


def parse_slice(text: str) -> Slice:
    """`v5p-64`, `v5litepod-4`, `2xv5p-64`: a Slice, or a one-line ConfigError listing the valid names."""
    m = re.fullmatch(r"(?:(\d+)x)?([a-z0-9]+)-(\d+)", text.strip().lower())
    chip = _family(m.group(2)) if m else None
    n = int(m.group(3)) if m else 0
    per = 2 if chip is not None and chip.counts == "cores" else 1
    if chip is None or n % per or n // per not in chip.shapes or (m.group(1) is not None and int(m.group(1)) < 1):
        families = ", ".join(f"{c.family}-{{{','.join(str(k * (2 if c.counts == 'cores' else 1)) for k in c.shapes)}}}"
                             for c in CHIPS.values())
        raise ConfigError(f"--topology {text}: not a TPU slice this plan knows; valid: {families} "
                          f"(v5litepod-N = v5e-N; a leading Kx = K slices, e.g. 2xv5p-64)")
    name = f"{chip.family}-{n}" if m.group(1) is None else f"{m.group(1)}x{chip.family}-{n}"
    return Slice(name, chip, n // per, int(m.group(1) or 1))


def slices_of(chip: Chip, num_slices: int = 1) -> list[Slice]:
    """Every slice of a family, smallest first (`--search`)."""
    per = 2 if chip.counts == "cores" else 1
    prefix = "" if num_slices == 1 else f"{num_slices}x"
    return [Slice(f"{prefix}{chip.family}-{k * per}", chip, k, num_slices) for k in sorted(chip.shapes)]


def libtpu_available() -> bool:
    return importlib.util.find_spec("libtpu") is not None


def compile_only_environment() -> None:
    """libtpu's settings for compiling without a TPU (read when its plugin starts): no metadata server to
    ask, one worker, and no one-process lock (`/tmp/libtpu_lockfile`: several plans, or test workers, may
    compile at once; nothing runs on a TPU)."""
    if tpu_visible():
        return
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    os.environ.setdefault("TPU_WORKER_ID", "0")
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")


def quiet_tpu_environment() -> None:
    """Before JAX starts its backends, on a machine without a TPU where libtpu is installed: JAX would try
    the TPU backend and print libtpu's warnings about the TPU it cannot find. Its backends are then the
    CPU's (unless JAX_PLATFORMS is set, or a GPU plugin is installed), and a TPU slice is still compiled
    for through libtpu's own topology API."""
    compile_only_environment()
    quiet_libtpu()  # what every command does at start (dapo_jax/startup.py); again, for a plan run in-process


@contextlib.contextmanager
def _stderr_captured():
    """The process's stderr (file descriptor 2: libtpu's C++ logging) into a temporary file; yields a
    function that reads what was written."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield lambda: (tmp.seek(0), tmp.read().decode(errors="replace"))[1]
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def topology_devices(s: Slice) -> list:
    """Compile-only devices of the slice (libtpu's `get_topology_desc`): a one-line ConfigError when libtpu
    is missing or refuses the topology. libtpu's start-up chatter on a machine without a TPU is hidden."""
    if not libtpu_available():
        raise ConfigError(f"--topology {s.name}: compiling for a TPU needs libtpu, which is not installed: {INSTALL}")
    from jax.experimental import topologies

    compile_only_environment()
    with _stderr_captured() as chatter:
        try:
            return list(topologies.get_topology_desc(topology_name=s.topology, platform="tpu",
                                                     **s.topology_kwargs()).devices)
        except Exception as e:  # noqa: BLE001 - libtpu raises JaxRuntimeError / RuntimeError with its reason
            reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"--topology {s.name}: libtpu refused topology {s.topology} {s.topology_kwargs()}: "
                              f"{reason}{' ' + chatter().strip().splitlines()[-1] if chatter().strip() else ''}") from e


__all__ = ["CHIPS", "Chip", "INSTALL", "Slice", "compile_only_environment", "libtpu_available", "parse_family", "parse_slice",
           "quiet_tpu_environment", "slices_of", "topology_devices", "valid_names"]
