"""`resolve(cfg)`: the one step after validation that chooses the fast paths a config leaves unset (`null`).

    cfg = resolve(load_config("tiny_dapo"))   # optim.packing, rollout.compaction: true where they apply
"""

from __future__ import annotations

from typing import Any

from dapo_jax.training.config.run import RunConfig


def resolve(cfg: RunConfig) -> RunConfig:
    """`cfg` with the fast paths it leaves unset (`null`) chosen: the one step after validation that fills them,
    called where a run (`train`) and a plan (`make_plan`) start, and shown in the run's config.

    `optim.packing` and `rollout.compaction` left unset become what is exact and faster here: both compute the
    same update and rollout as the plain paths (tests/training/update/test_packed_step.py,
    tests/sampling/test_compaction.py), so they are on wherever they apply (docs/benchmarks.md, "Fast paths by
    default"): packing except for group DPO (its metric counts the padded batch's prompts), compaction without
    continuous batching and when a round's rows halve to at least `rollout.compaction_min_rows`. What a config
    names is kept; a resolved config resolves to itself."""
    r, o = cfg.rollout, cfg.optim
    update = {}
    if o.packing is None:
        update["optim"] = o.model_copy(update={"packing": cfg.objective_config.kind != "gdpo"})
    if r.compaction is None:
        halves = (r.gen_batch * r.G) // 2 >= r.compaction_min_rows
        update["rollout"] = r.model_copy(update={"compaction": not r.continuous and halves})
    return cfg.model_copy(update=update) if update else cfg


def resolved_keys(before: RunConfig, after: RunConfig) -> dict[str, Any]:
    """`{dotted key: value}` of what `resolve` chose (the keys `before` left unset), for the run to print."""
    return {f"{section}.{key}": getattr(getattr(after, section), key)
            for section, key in (("optim", "packing"), ("rollout", "compaction"))
            if getattr(getattr(before, section), key) is None}


def is_resolved(cfg: RunConfig) -> bool:
    """Whether `resolve` has filled every fast path (the programs are built only from a resolved config)."""
    return cfg.optim.packing is not None and cfg.rollout.compaction is not None
