"""`dapo-jax plan CONFIG --topology v5p --search`: the smallest slice of a TPU family that fits, and the next one up.

    result = search(cfg, "v5p")          # plans v5p-8, v5p-16, ... until one fits, then the next size up
    print(format_search(result))

For each size, smallest first, the meshes `data x fsdp x tensor` with as many devices as the slice that
the config accepts (batches divisible over data x fsdp, `models.sharding.check_divisible`: heads, KV
heads, vocabulary and MLP width over tensor) are ranked by how thinly they spread the state: most
parameter shards (fsdp x tensor) first, then most batch shards (data x fsdp), then the least tensor
parallelism (its collectives sit inside every layer). A size is skipped without compiling when the
resident state alone (parameters, optimizer, reference, critic: exact bytes from the abstract state,
split fsdp x tensor ways) exceeds a device's HBM; otherwise its best `meshes_per_size` meshes are
planned (`plan.make_plan`, compiled and cached as any plan) until one fits.
"""

from __future__ import annotations

import dataclasses

import jax

from dapo_jax.parallel.mesh import make_mesh
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.resolve import resolve
from dapo_jax.training.config.run import RunConfig, config_from_dict
from dapo_jax.training.plan.compile import GiB
from dapo_jax.training.plan.memory import Plan, make_plan
from dapo_jax.training.plan.model_config import plan_model_config
from dapo_jax.training.plan.programs import build_world
from dapo_jax.training.plan.report import format_plan, gib, plan_dict
from dapo_jax.training.plan.slices import parse_family, slices_of


@dataclasses.dataclass
class Candidate:
    slice_name: str
    mesh: tuple[int, int, int]  # data, fsdp, tensor
    plan: Plan | None = None
    skipped: str | None = None  # why it was not planned

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits


@dataclasses.dataclass
class SearchResult:
    family: str
    tried: list[Candidate]
    best: Candidate | None
    next_up: Candidate | None


def with_mesh(cfg: RunConfig, data: int, fsdp: int, tensor: int) -> RunConfig:
    """`cfg` with another mesh, validated (a ConfigError when the batches do not split over it)."""
    dump = cfg.model_dump(mode="json")
    dump["mesh"] = {**dump["mesh"], "data": data, "fsdp": fsdp, "tensor": tensor}
    return config_from_dict(dump, source="--search")


def meshes(cfg: RunConfig, model_cfg, devices: int) -> list[tuple[int, int, int]]:
    """Every (data, fsdp, tensor) of `devices` devices the config and the model accept, best first (module docstring)."""
    out = []
    for tensor in _divisors(devices):
        if any(dim % tensor for dim in (model_cfg.num_attention_heads, model_cfg.num_key_value_heads,
                                         model_cfg.vocab_size, model_cfg.intermediate_size)):
            continue
        for fsdp in _divisors(devices // tensor):
            data = devices // tensor // fsdp
            if any(dim % fsdp for dim in (model_cfg.hidden_size, model_cfg.intermediate_size,
                                           model_cfg.num_attention_heads * model_cfg.head_dim)):
                continue
            try:
                with_mesh(cfg, data, fsdp, tensor)
            except ConfigError:
                continue
            out.append((data, fsdp, tensor))
    return sorted(out, key=lambda m: (-(m[1] * m[2]), -(m[0] * m[1]), m[2]))


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def resident_bytes(cfg: RunConfig, model_cfg) -> int:
    """The run's resident state in bytes on ONE device (nothing sharded): parameters, optimizer, reference, critic."""
    one = with_mesh(cfg, 1, 1, 1)
    world = build_world(one, model_cfg, make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    return sum(world.resident().values())


def search(cfg: RunConfig, family: str, *, meshes_per_size: int = 2, log=None, model_config=None, **plan_options) -> SearchResult:
    """The smallest slice of `family` (e.g. "v5p") that fits, and the next size up (module docstring)."""
    cfg = resolve(cfg)  # the run's fast paths, as `train` resolves them
    log = log or (lambda *_: None)
    chip = parse_family(family.split("-")[0])
    if chip is None:
        raise ConfigError(f"--topology {family}: not a TPU family (v4, v5e, v5litepod, v5p, v6e, tpu7x)")
    model_cfg, _ = plan_model_config(cfg, model_config)
    whole = resident_bytes(cfg, model_cfg)
    tried: list[Candidate] = []
    best = next_up = None
    sizes = slices_of(chip)
    for i, s in enumerate(sizes):
        found = _plan_size(cfg, model_cfg, s, whole, meshes_per_size, tried, log, model_config, plan_options)
        if found is not None:
            best = found
            if i + 1 < len(sizes):
                next_up = _plan_size(cfg, model_cfg, sizes[i + 1], whole, 1, tried, log, model_config, plan_options,
                                     headroom=True)
            break
    return SearchResult(chip.family, tried, best, next_up)


def _plan_size(cfg, model_cfg, s, whole: int, limit: int, tried: list, log, model_config, plan_options,
               headroom: bool = False) -> Candidate | None:
    capacity = plan_options.get("device_memory_gib")
    capacity = int(capacity * GiB) if capacity else s.hbm_per_device
    options = meshes(cfg, model_cfg, s.devices)
    if not options:
        tried.append(Candidate(s.name, (0, 0, 0), skipped=f"no data x fsdp x tensor of {s.devices} devices divides "
                                                          f"the batches and the heads"))
        return None
    for mesh in options[:limit]:
        floor = whole // (mesh[1] * mesh[2])
        if floor > capacity and not headroom:
            tried.append(Candidate(s.name, mesh, skipped=f"the resident state alone is {floor / GiB:.1f} GiB per device "
                                                         f"(> {capacity / GiB:.2f})"))
            continue
        log(f"planning {s.name} with mesh data {mesh[0]} x fsdp {mesh[1]} x tensor {mesh[2]} ...")
        plan = make_plan(with_mesh(cfg, *mesh), topology=s.name, model_config=model_config, log=log, **plan_options)
        tried.append(Candidate(s.name, mesh, plan))
        if plan.fits or headroom:
            return tried[-1]
    return None


def format_search(result: SearchResult) -> str:
    lines = [f"dapo-jax plan --search over {result.family}:"]
    for c in result.tried:
        mesh = f"data {c.mesh[0]} x fsdp {c.mesh[1]} x tensor {c.mesh[2]}" if c.mesh[0] else "-"
        if c.plan is None:
            lines.append(f"  {c.slice_name:<12} {mesh:<32} skipped: {c.skipped}")
        else:
            p = c.plan
            state = "fits" if p.fits else "does not fit: " + ", ".join(x.name for x in p.over())
            uncertain = p.uncertain() if p.fits else []  # the verdict's flag (report.verdict_lines)
            if uncertain:
                state += " (" + ", ".join(x.name for x, _ in uncertain) + " within the rollout line's error)"
            lines.append(f"  {c.slice_name:<12} {mesh:<32} peak {gib(p.peak)} GiB ({p.peak_phase}) of "
                         f"{gib(p.capacity) if p.capacity else '?'}: {state}")
    if result.best is None:
        lines.append(f"VERDICT: no {result.family} slice fits")
        return "\n".join(lines)
    lines += ["", f"smallest slice that fits: {result.best.slice_name}", format_plan(result.best.plan)]
    if result.next_up is not None and result.next_up.plan is not None:
        n = result.next_up
        lines += ["", f"next size up, for headroom: {n.slice_name}, mesh data {n.mesh[0]} x fsdp {n.mesh[1]} x "
                  f"tensor {n.mesh[2]}: peak {gib(n.plan.peak)} GiB per device ({n.plan.peak_phase})"]
    return "\n".join(lines)


def search_dict(result: SearchResult) -> dict:
    def cand(c: Candidate | None):
        if c is None:
            return None
        return {"slice": c.slice_name, "mesh": dict(zip(("data", "fsdp", "tensor"), c.mesh)), "skipped": c.skipped,
                "plan": plan_dict(c.plan) if c.plan is not None else None}

    return {"family": result.family, "tried": [cand(c) for c in result.tried], "best": cand(result.best),
            "next_up": cand(result.next_up), "fits": result.best is not None}


__all__ = ["Candidate", "SearchResult", "format_search", "meshes", "search", "search_dict", "with_mesh"]
