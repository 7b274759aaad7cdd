"""`dapo-jax plan`: when the run does not fit, the smallest change that makes it fit.

    tries = fit_search(cfg, plan, topology=..., device_memory_gib=...)   # plan: the run's, not fitting
    print(format_fit(tries))     # "TO FIT: optim.micro_batches=4 (peak 71.20 GiB per device ...)"

The candidates are config overrides, least invasive first, each compiled as a plan of its own (as
`--search` compiles its slices; unchanged programs come from the compile cache), and the search stops at
the first that fits:

1. more micro-batches (`optim.micro_batches` x2, x4, ...): the same update, exactly (the gradient is
   accumulated as `(Σ loss_sum, Σ denominator)`); the update and the log-prob passes hold fewer rows at a
   time. Tried when the update, log-prob or critic phase is over.
2. smaller packed chunks (`optim.packing_rows` halved, not below G): the same update, fewer rows a chunk.
3. no overlap (`rollout.overlap=false`) when the update and the overlapped rollout do not fit together.
4. smaller generation rounds (`rollout.gen_batch` halved, `rollout.max_gen_batches` doubled so that the
   same prompts can be sampled): when a rollout phase is over; the same distribution, sampled in more rounds.
5. recomputed activations (`model.remat=full`), alone, then with more micro-batches: a third more update FLOPs.
6. another mesh of the same devices (more parameter shards first, `plan/search.py`'s `meshes`).

Only overrides the config accepts are tried (a `ConfigError` skips one: batches that do not split over the
mesh, ...). At most `max_tries` are compiled.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Iterator

from dapo_jax.training.plan import memory as plan_module
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import RunConfig, config_from_dict

UPDATE_PHASES = ("update", "log-prob", "critic", "update + overlapped rollout")
ROLLOUT_PHASES = ("rollout", "eval rollout", "update + overlapped rollout")


@dataclasses.dataclass
class FitTry:
    """One candidate change: its overrides and its plan (or why it was not planned)."""

    overrides: dict[str, Any]
    plan: Any = None  # plan.Plan
    skipped: str | None = None

    @property
    def fits(self) -> bool:
        return self.plan is not None and self.plan.fits

    @property
    def text(self) -> str:
        """The overrides as the command line takes them: `optim.micro_batches=4 model.remat=full`."""
        return " ".join(f"{k}={_yaml(v)}" for k, v in self.overrides.items())


def _yaml(v) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def with_overrides(cfg: RunConfig, overrides: dict[str, Any]) -> RunConfig:
    """`cfg` with dotted `overrides` applied, validated (a ConfigError when the config refuses them)."""
    dump = cfg.model_dump(mode="json")
    for key, value in overrides.items():
        *path, last = key.split(".")
        node = dump
        for part in path:
            node = node[part]
        node[last] = value
    return config_from_dict(dump, source="plan fit", overridden=set(overrides))


def _chunk_rows(plan) -> int | None:
    """The packed update's chunk height in `plan` (its programs `update: chunk RxL`), or None (unpacked)."""
    rows = [int(m.group(1)) for p in plan.programs if (m := re.match(r"update: chunk (\d+)x\d+", p.name))]
    return max(rows) if rows else None


def candidates(cfg: RunConfig, plan, model_cfg) -> Iterator[dict[str, Any]]:
    """The changes to try for `plan` (of `cfg`, not fitting), least invasive first (module docstring)."""
    over = {p.name for p in plan.over()}
    o, r = cfg.optim, cfg.rollout
    update_over = bool(over & set(UPDATE_PHASES))
    per_mini = r.train_batch // o.num_minibatches
    more_micro = [m for m in (2, 4, 8, 16, 32, 64) if o.micro_batches * m <= per_mini]
    if update_over:
        for m in more_micro:
            yield {"optim.micro_batches": o.micro_batches * m}
        rows = _chunk_rows(plan)
        while rows is not None and rows // 2 >= (1 if cfg.objective_config.supervised else r.G):
            rows //= 2
            yield {"optim.packing_rows": rows}
    if "update + overlapped rollout" in over:
        yield {"rollout.overlap": False}
    if over & set(ROLLOUT_PHASES):
        g, n = r.gen_batch, r.max_gen_batches
        while g // 2 >= 1:
            g, n = g // 2, n * 2
            yield {"rollout.gen_batch": g, "rollout.max_gen_batches": n}
    if update_over and cfg.model.remat != "full":
        yield {"model.remat": "full"}
        for m in more_micro:
            yield {"model.remat": "full", "optim.micro_batches": o.micro_batches * m}
    from dapo_jax.training.plan.search import meshes

    devices = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor
    here = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    for mesh in meshes(cfg, model_cfg, devices):
        if mesh != here:
            yield {"mesh.data": mesh[0], "mesh.fsdp": mesh[1], "mesh.tensor": mesh[2]}


def fit_search(cfg: RunConfig, plan, *, max_tries: int = 8, log=None, model_config=None, **plan_options) -> list[FitTry]:
    """Plans the candidates for `plan` (of `cfg`) in order until one fits; every try, the fitting one last.
    `plan_options`: `plan.make_plan`'s (topology, device_memory_gib, exact, cache, only, ...)."""
    log = log or (lambda *_: None)
    model_cfg, _ = plan_module.plan_model_config(cfg, model_config)
    tries: list[FitTry] = []
    planned = 0
    for overrides in candidates(cfg, plan, model_cfg):
        if planned >= max_tries:
            break
        try:
            candidate = with_overrides(cfg, overrides)
        except ConfigError as e:
            tries.append(FitTry(overrides, skipped=str(e).splitlines()[0]))
            continue
        text = FitTry(overrides).text
        log(f"does not fit: trying {text} ...")
        planned += 1
        tries.append(FitTry(overrides, plan_module.make_plan(candidate, model_config=model_config, log=log,
                                                             **plan_options)))
        if tries[-1].fits:
            break
    return tries


def format_fit(tries: list[FitTry]) -> str:
    """The one-line suggestion (`TO FIT: overrides`), after one line per candidate tried."""
    from dapo_jax.training.plan.report import gib

    lines = ["", "how to fit (each a plan of its own, least invasive first):"]
    for t in tries:
        if t.plan is None:
            lines.append(f"  {t.text}: not a valid config ({t.skipped})")
        else:
            state = "fits" if t.fits else "does not fit: " + ", ".join(p.name for p in t.plan.over())
            lines.append(f"  {t.text}: peak {gib(t.plan.peak)} GiB per device ({t.plan.peak_phase}): {state}")
    best = next((t for t in tries if t.fits), None)
    if best is None:
        lines.append(f"TO FIT: none of the {sum(t.plan is not None for t in tries)} changes tried fits: a larger slice "
                     f"(--topology FAMILY --search), a shorter context or a smaller batch")
    else:
        cap = best.plan.capacity
        lines.append(f"TO FIT: {best.text}  (peak {gib(best.plan.peak)} GiB per device, {best.plan.peak_phase}, of "
                     f"{gib(cap) if cap else '?'})")
    return "\n".join(lines)


def fit_dict(tries: list[FitTry]) -> dict:
    best = next((t for t in tries if t.fits), None)
    return {"tried": [{"overrides": t.overrides, "skipped": t.skipped, "fits": t.fits,
                       "peak": t.plan.peak if t.plan is not None else None} for t in tries],
            "suggestion": best.overrides if best is not None else None}


__all__ = ["FitTry", "candidates", "fit_dict", "fit_search", "format_fit", "with_overrides"]
