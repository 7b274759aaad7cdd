"""`dapo-jax plan CONFIG`: will the run fit? Per-device memory of each phase from the run's own compiled
programs, for this machine's devices or a TPU slice by name, before anything is loaded.

    p = make_plan(cfg, topology="v5p-64")       # compiles the run's programs for 32 compile-only v5p devices
    print(format_plan(p)); p.fits               # dapo-jax plan exits 0 if it fits, 3 if not

Nothing is loaded or allocated: `programs.build_world` lays out the abstract run and its programs
(the trainer's own factories, `training/update/programs.py`), each is lowered and compiled ahead of time for the
mesh, and `memory_analysis()` gives its per-device bytes (`compile.py`). Per device, a phase holds
what stays resident (parameters, optimizer state, a LoRA run's frozen base, the reference policy, the
critic's state) plus what its largest program adds while it runs:

    phase = resident + (arguments - resident arguments) + outputs - aliased (donated) + temporaries + held

where `held` is what the program runs beside (the packed update keeps the prepared batch while its chunks
run). The phases are the rollout (and the evaluation's), the log-prob pass (`prepare`: log π_old, log π_ref,
the critic's values, the advantages), the update and the critic's update, and each learned reward model's
scoring (its frozen weights resident for the whole run, `training/plan/reward_models.py`); with `rollout.overlap` the next
rollout runs during the update, on a copy of the parameters ("update + overlapped rollout").

A model of more than three layers whose programs run their layers as a scan is compiled at 2 and 3 layers
and extrapolated per layer (`compile.extrapolate`: exact for a scan; `--exact` compiles the whole
model); on a TPU, a program the line gives under `SMALL` temporaries at the full depth is compiled whole
(at 2 or 3 layers it may keep buffers in on-chip VMEM, which memory_analysis leaves out). A program the
TPU compiler refuses for lack of memory gives its "required" bytes as temporaries.
The capacity is the slice's usable HBM per device (`slices.py`), `--device-memory`, the device's own
`memory_stats()`, or on a CPU the host's RAM shared by the mesh's devices.
"""

from __future__ import annotations

import dataclasses
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jax

from dapo_jax.models.sharding import check_divisible
from dapo_jax.parallel.mesh import make_mesh
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.resolve import resolve
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.plan.chips import chip_for
from dapo_jax.training.plan.compile import (Figures, GiB, cache_dir, extrapolate, lower_for, package_versions,
                                            shard_bytes)
from dapo_jax.training.plan.estimate import step_time
from dapo_jax.training.plan.model_config import critic_model_config, plan_model_config, teacher_model_config
from dapo_jax.training.plan.programs import build_world, num_params
from dapo_jax.training.plan.slices import parse_slice, topology_devices

EXTRAPOLATE_FROM = (2, 3)  # layers compiled when extrapolating (a scan needs 2 or more)
SAMPLER_PHASES = ("rollout", "eval rollout")  # programs whose layers are unrolled: no exact line in the depth
# the rollout line's worst measured error: its temporaries 41% under the whole compile's (docs/long_context.md,
# "How far the rollout's line holds"); the verdict flags a fit that this error would undo
ROLLOUT_LINE_LOW = 0.41
SMALL = 512 * 2**20  # a TPU program with fewer temporaries may keep some in on-chip VMEM: compiled whole


@dataclasses.dataclass
class ProgramPlan:
    """One of the run's programs, compiled (or extrapolated from compiled ones)."""

    name: str
    phase: str
    figures: Figures
    attention: str
    shape: str
    compile_s: float
    cached: bool
    layers: tuple[int, ...]  # the layer counts it was compiled at
    bounded_by: str | None = None  # not compiled: its figures are this program's, an upper bound (programs.Job)

    @property
    def extrapolated(self) -> bool:
        return len(self.layers) > 1


@dataclasses.dataclass
class PhasePlan:
    name: str
    total: int  # bytes per device at the phase's peak program
    program: str  # that program
    added: dict[str, int]  # what it adds to the resident state: inputs, outputs, temporaries, held
    refused: str | None = None


@dataclasses.dataclass
class Plan:
    """Per-device bytes of a run (module docstring)."""

    target: str  # "v5p-64 (32 x TPU v5)" or "2 x cpu"
    mesh: dict
    model_source: str
    num_params: int
    layers: int
    resident: dict[str, int]
    kv_cache: int
    programs: list[ProgramPlan]
    phases: list[PhasePlan]
    capacity: int | None
    capacity_source: str
    versions: str
    estimate: dict | None = None
    slice_name: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    @property
    def resident_total(self) -> int:
        return sum(self.resident.values())

    @property
    def peak(self) -> int:
        return max(p.total for p in self.phases)

    @property
    def peak_phase(self) -> str:
        return max(self.phases, key=lambda p: p.total).name

    @property
    def compile_s(self) -> float:
        return sum(p.compile_s for p in self.programs if not p.cached)

    def over(self) -> list[PhasePlan]:
        """The phases that do not fit."""
        if self.capacity is None:
            return [p for p in self.phases if p.refused]
        return [p for p in self.phases if p.total > self.capacity or p.refused]

    @property
    def fits(self) -> bool:
        return not self.over()

    def uncertain(self) -> list[tuple[PhasePlan, int]]:
        """The fitting rollout phases whose program is extrapolated and would not fit were its temporaries
        as far under the truth as the line has been measured (`ROLLOUT_LINE_LOW`): `(phase, bytes then)`."""
        if self.capacity is None:
            return []
        programs = {p.name: p for p in self.programs}
        out = []
        for phase in self.phases:
            program = programs.get(phase.program)
            if phase.name not in SAMPLER_PHASES or program is None or not program.extrapolated:
                continue
            temps = phase.added.get("temporaries", 0)
            worst = phase.total - temps + int(temps / (1 - ROLLOUT_LINE_LOW))
            if phase.total <= self.capacity < worst:
                out.append((phase, worst))
        return out


def plan_devices(cfg: RunConfig, topology: str | None = None):
    """`(devices, Slice or None)`: a TPU slice's compile-only devices, or this host's."""
    if topology is None:
        return jax.devices(), None
    s = parse_slice(topology)
    return topology_devices(s), s


def make_mesh_for(cfg: RunConfig, devices, target: str):
    m = cfg.mesh
    n = m.data * m.fsdp * m.tensor
    if n > len(devices):
        raise ConfigError(f"mesh: data*fsdp*tensor={n} ({m.data}x{m.fsdp}x{m.tensor}) but {target} has {len(devices)} "
                          f"devices: set mesh.data / mesh.fsdp / mesh.tensor to multiply to {len(devices)}, or use "
                          f"--search (on CPU: --cpu-devices {n})")
    return make_mesh(m.data, m.fsdp, m.tensor, devices=list(devices)[:n])


def _capacity(devices, n: int, device_memory_gib: float | None, tpu_slice) -> tuple[int | None, str]:
    if device_memory_gib is not None:
        return int(device_memory_gib * GiB), "--device-memory"
    if tpu_slice is not None:
        return tpu_slice.hbm_per_device, tpu_slice.capacity_source
    try:
        stats = devices[0].memory_stats()
    except Exception:  # noqa: BLE001 - some backends have none
        stats = None
    if stats and stats.get("bytes_limit"):
        return int(stats["bytes_limit"]), f"{devices[0].device_kind} memory_stats()"
    if devices[0].platform == "cpu" and hasattr(os, "sysconf"):
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return ram // n, f"host RAM {ram / GiB:.1f} GiB shared by {n} CPU device(s)"
    return None, "unknown (pass --device-memory GiB)"


def make_plan(cfg: RunConfig, *, topology: str | None = None, device_memory_gib: float | None = None,
              model_config: str | Path | None = None, exact: bool = False, log=None, only: tuple[str, ...] | None = None,
              cache: Path | None | bool = True, estimate: dict | None = None, jobs: int | None = None) -> Plan:
    """Compiles the run's programs (`only`: their names' prefixes) for this host's devices or the TPU slice
    `topology` (e.g. "v5p-64"), on abstract inputs, and adds them up per phase (module docstring).
    `estimate`: `estimate.step_time`'s options, or None for no time estimate; `jobs`: programs compiled at
    once (default: the CPU cores, at most 4; XLA compiles one program on one core)."""
    cfg = resolve(cfg)  # the run's fast paths, as `train` resolves them
    log = log or (lambda *_: None)
    jobs = jobs or min(4, os.cpu_count() or 1)
    model_cfg, source = plan_model_config(cfg, model_config)
    devices, tpu_slice = plan_devices(cfg, topology)
    mesh = make_mesh_for(cfg, devices, tpu_slice.name if tpu_slice is not None else "this host")
    check_divisible(model_cfg, mesh)
    n = mesh.devices.size
    used = f"{n} x {devices[0].device_kind}" if n == len(devices) else f"{n} of {len(devices)} x {devices[0].device_kind}"
    target = f"{tpu_slice.name} ({used})" if tpu_slice is not None else used
    capacity, capacity_source = _capacity(devices, n, device_memory_gib, tpu_slice)
    layers = model_cfg.num_hidden_layers
    critic_layers = critic_model_config(cfg, model_cfg).num_hidden_layers if cfg.objective_config.uses_critic else layers
    exact = exact or critic_layers != layers  # a critic of another depth: no single line in the layers
    compile_at = (layers,) if exact or layers <= max(EXTRAPOLATE_FROM) else EXTRAPOLATE_FROM
    versions = package_versions()
    key = f"{target} mesh {dict(mesh.shape)} {tpu_slice.topology_kwargs() if tpu_slice else ''} {versions}"
    cache = cache_dir() if cache is True else (cache or None)

    line = len(compile_at) > 1

    def run(item):
        name, count, m = item
        hit = m.cached() is not None
        depth = f" ({count} layer{'s' * (count > 1)})" if jobs_of[name].layered else ""
        if not hit:
            log(f"compiling {name}{depth} for {target} ...")
        result = m.run()
        if not hit:
            log(f"  {name}{depth}: {result[1]:.1f} s{', refused: does not fit' if result[0].refused else ''}")
        return name, count, result

    with jax.set_mesh(mesh), ThreadPoolExecutor(max(1, jobs)) as pool:
        full = build_world(cfg, model_cfg, mesh)
        jobs_of, bounded, order = {}, {}, []
        lowered = []  # every program is lowered here (under the mesh) before any compiles: a lowering error comes first
        for count in compile_at:
            world = full if count == layers else build_world(cfg, model_cfg.replace(num_hidden_layers=count), mesh)
            for job in world.jobs():
                if only is not None and not job.name.startswith(only):
                    continue
                if job.name not in order:
                    order.append(job.name)
                if line and job.bounded_by in jobs_of:  # a shorter chunk: the taller one's figures bound it
                    bounded[job.name] = job
                    continue
                if not job.layered and job.name in jobs_of:  # the same program at every policy depth: once
                    continue
                jobs_of[job.name] = job
                lowered.append((job.name, count, lower_for(job.lower, target=key, args=(job.args, job.kwargs),
                                                           resident=job.resident, held=job.held, cache=cache)))
        measured: dict[str, dict[int, tuple]] = {}
        for name, count, result in pool.map(run, lowered):  # compiled on `jobs` threads
            measured.setdefault(name, {})[count] = result
        platform = mesh.devices.flat[0].platform
        small = {name for name, by in measured.items() if len(by) > 1 and
                 compile_whole({n: r[0] for n, r in by.items()}, layers, platform=platform)}
        again = [j for j in full.jobs() if j.name in small] if small else []
        pending = [(j.name, layers, lower_for(j.lower, target=key, args=(j.args, j.kwargs), resident=j.resident,
                                              held=j.held, cache=cache)) for j in again]
        whole = {name: result for name, _, result in pool.map(run, pending)}
        resident = full.resident()
        plans = {}
        for name, by_layers in measured.items():
            job = jobs_of[name]
            seconds, cached = sum(v[1] for v in by_layers.values()), all(v[2] for v in by_layers.values())
            if name in whole:
                figures, layers_used = whole[name][0], (layers,)
                seconds, cached = seconds + whole[name][1], cached and whole[name][2]
            elif len(by_layers) == 1:
                figures, layers_used = next(iter(by_layers.values()))[0], tuple(by_layers)
            else:
                (l0, (f0, *_)), (l1, (f1, *_)) = sorted(by_layers.items())
                figures, layers_used = extrapolate(f0, f1, l0, l1, layers), (l0, l1)
            plans[name] = ProgramPlan(name, job.phase, figures, job.attention, job.shape, seconds, cached, layers_used)
        for name, job in bounded.items():
            bound = plans[job.bounded_by]
            plans[name] = ProgramPlan(name, job.phase, bound.figures, job.attention, job.shape, 0.0, False, bound.layers,
                                      bounded_by=job.bounded_by)
        programs = [plans[name] for name in order if name in plans]
        params_copy = shard_bytes_of(full.state.params)
    refusal_hbm = [p.figures.available for p in programs if p.figures.available]
    if refusal_hbm and device_memory_gib is None:
        capacity, capacity_source = refusal_hbm[0], "the HBM the TPU compiler reported when it refused a program"
    plan = Plan(target, dict(mesh.shape), source, num_params(full), layers, resident, full.kv_cache(), programs,
                phases(programs, sum(resident.values()), overlap=cfg.rollout.overlap, params_copy=params_copy),
                capacity, capacity_source, versions, slice_name=tpu_slice.name if tpu_slice else None)
    if len(compile_at) > 1:
        plan.notes.append(f"programs compiled at {compile_at[0]} and {compile_at[1]} layers are extrapolated to {layers} "
                          f"(the layers' buffers grow by the same bytes per layer); on a TPU, those the line gives under "
                          f"{SMALL >> 20} MiB of temporaries are compiled whole; --exact compiles all {layers} layers")
    if bounded:
        plan.notes.append(f"not compiled: {', '.join(bounded)}, the same program on fewer rows than "
                          f"{', '.join(sorted({j.bounded_by for j in bounded.values()}))}, whose figures bound it; "
                          "--exact compiles it")
    if any(p.extrapolated and p.phase in SAMPLER_PHASES for p in programs):
        plan.notes.append("the rollouts' layers are unrolled, so their line is approximate: against whole compiles it "
                          f"was measured from {ROLLOUT_LINE_LOW:.0%} low to 28% high (docs/long_context.md); --exact "
                          "gives their exact figures")
    if estimate is not None:
        chip = tpu_slice.chip if tpu_slice else chip_for(devices[0].device_kind)  # a local GPU's, or None on a CPU
        plan.estimate = step_time(cfg, model_cfg, mesh=dict(mesh.shape), chip=chip, devices=n,
                                  share_prompts=full.programs.share_prompts, teacher=teacher_model_config(cfg),
                                  **estimate)
    return plan


def compile_whole(by_layers: dict[int, Figures], layers: int, *, platform: str) -> bool:
    """Whether a program compiled at two depths (`{layer count: Figures}`) is compiled again at all `layers`.

    On a TPU a small program may keep buffers in on-chip VMEM (128 MiB on v5e) at 2 or 3 layers, which
    memory_analysis does not count, and not at the full depth, so its figures leave the line (a Qwen2.5-0.5B
    AdamW update: 0.36 GiB of temporaries by the line, 0.68 GiB compiled whole): those the line puts under
    `SMALL` at the full depth are compiled whole, as small programs compile quickly. A large one follows the
    line (the AdamW update of 32B parameters: 4.025 GiB by the line, 4.039 whole) and its whole compile
    took longer than all the others together, so it is not."""
    if platform != "tpu" or len(by_layers) < 2:
        return False
    (l0, f0), (l1, f1) = sorted(by_layers.items())[:2]
    return not (f0.refused or f1.refused) and extrapolate(f0, f1, l0, l1, layers).temporaries < SMALL


def shard_bytes_of(tree) -> int:
    return shard_bytes(tree)


def phases(programs: list[ProgramPlan], resident: int, *, overlap: bool = False, params_copy: int = 0) -> list[PhasePlan]:
    """Each phase's peak: the resident state plus what its largest program adds (module docstring)."""
    out: dict[str, PhasePlan] = {}
    for p in programs:
        f = p.figures
        total = resident + f.added
        if p.phase not in out or total > out[p.phase].total:
            out[p.phase] = PhasePlan(p.phase, total, p.name, _added(f), f.refused)
        elif f.refused and not out[p.phase].refused:
            out[p.phase].refused = f.refused
    if overlap and "update" in out and "rollout" in out:  # the next rollout runs during the update
        up, ro = out["update"], out["rollout"]
        added = {**{f"update {k}": v for k, v in up.added.items()}, **{f"rollout {k}": v for k, v in ro.added.items()},
                 "parameters copy for the rollout": params_copy}
        out["update + overlapped rollout"] = PhasePlan("update + overlapped rollout", up.total + ro.total - resident
                                                       + params_copy, f"{up.program} + {ro.program}", added,
                                                       up.refused or ro.refused)
    return list(out.values())


def _added(f: Figures) -> dict[str, int]:
    return {"inputs": f.arguments - f.resident_args, "outputs (not donated)": f.outputs - f.aliased,
            "temporaries": f.temporaries, "held beside it": f.held}


def set_cpu_devices(n: int) -> None:
    """`n` virtual CPU devices; must run before JAX starts its backends."""
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError as e:
        raise ConfigError(f"--cpu-devices {n}: {e}") from e


__all__ = ["EXTRAPOLATE_FROM", "PhasePlan", "Plan", "ProgramPlan", "compile_whole", "make_plan", "phases", "plan_devices",
           "set_cpu_devices"]
