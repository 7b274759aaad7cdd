"""A chain of stages (R1's cold-start SFT -> RL -> rejection-sampling SFT -> RL) as one resumable run.

    plan = load_stages("dapo_jax/configs/stages/cot_r1.yaml")     # every stage's RunConfig, checked up front
    run_stages(plan)                                              # or `dapo-jax stages FILE`; rerun = resume

A stages file names a run dir and a list of stages; each stage is a run recipe with its overrides
(its own data, objective and steps: `dapo-jax train`'s words) and, for rejection-sampling fine-tuning,
an `rft` section (the prompts to sample, k, per_prompt, limit):

    run_dir: runs/cot_r1
    stages:
      - {name: cold_start, recipe: cot_sft, overrides: [train.steps=40]}
      - {name: rl, recipe: cot_dapo, overrides: [train.steps=100]}
      - {name: rft, recipe: cot_sft, rft: {prompts: {name: cot, split: train}, k: 8}, overrides: [train.steps=20]}
      - {name: rl2, recipe: cot_dapo, overrides: [train.steps=100]}

Stage `i` is an ordinary run (`training/loop.py:train`, nothing else trains) in `RUN_DIR/i-NAME/`;
after the first, its `model.path` is the previous stage's final weights, exported there as a Hugging
Face model (`i-NAME/model/`, a LoRA stage's adapters merged). An `rft` stage first samples its data
from that model (training/rejection.py) into `i-NAME/kept.jsonl` and fine-tunes on it. A
`distill.teacher` of `stage:NAME` is that earlier stage's exported model.

Resume: a stage is done when its `model/` export is complete (written to a temporary folder, then
renamed); a rerun skips the done stages and reruns the first unfinished one, whose own checkpoints
resume it exactly where it stopped (the kept set, once written, is reused). `RUN_DIR/metrics.jsonl`
holds every stage's rows in order, each with `stage` (its name), `stage_index` and `stage_step`, and
`step` counted over the whole chain, so `dapo-jax plot RUN_DIR` draws the pipeline end to end.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import jax
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from dapo_jax.models.generation_config import load_generation_config
from dapo_jax.models.hf_io import save_pretrained
from dapo_jax.training import loop
from dapo_jax.training.build import build_mesh, load_model, load_tokenizer, load_trained_model
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.data import SourceSection
from dapo_jax.training.config.paths import find_config, resolve_path
from dapo_jax.training.config.run import RunConfig, load_config
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.rejection import rejection_sample

STAGE_PREFIX = "stage:"


class RftSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    prompts: SourceSection  # the prompts to sample (a data source, as data.train of an RL recipe)
    k: int = Field(default=8, ge=1)  # responses sampled per prompt
    per_prompt: int = Field(default=1, ge=1)  # at most this many kept per prompt
    limit: int | None = Field(default=None, gt=0)  # the first N prompts of the stage's data.train


class Stage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    name: str = Field(pattern=r"^[A-Za-z0-9_.-]+$")
    recipe: str  # a packaged recipe's name or a run config file
    overrides: list[str] = Field(default_factory=list)  # dotted key=value, as on the command line
    rft: RftSection | None = None  # sample the previous stage's model into this stage's SFT data first


class StagesFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    run_dir: str
    stages: list[Stage] = Field(min_length=1)


class StagePlan(BaseModel):
    """One stage, resolved: its folder and its RunConfig (model.path = the previous stage's export)."""

    model_config = ConfigDict(frozen=True, arbitrary_types_allowed=True)
    index: int
    stage: Stage
    dir: Path
    cfg: Any  # RunConfig

    @property
    def label(self) -> str:
        return f"stages.{self.index} ({self.stage.name})"

    @property
    def export(self) -> Path:
        return self.dir / "model"

    @property
    def kept(self) -> Path:
        return self.dir / "kept.jsonl"


def is_stages_file(path: str | Path) -> bool:
    """True when the YAML at `path` has a top-level `stages` list (and is not a run config)."""
    path = find_config(path)
    if path.is_dir() or not path.is_file():
        return False
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "stages" in data


def load_stages(path: str | Path, *, for_plan: bool = False) -> list[StagePlan]:
    """Every stage's config, validated before anything runs: a bad key or value raises one `ConfigError`
    line naming the file, the stage and the key. `for_plan`: every stage reads the first stage's
    model.path (the later stages' exports do not exist yet; they have its shapes)."""
    path = find_config(path)
    try:
        spec = StagesFile(**(yaml.safe_load(path.read_text()) or {}))
    except (yaml.YAMLError, TypeError) as e:
        raise ConfigError(f"{path}: not a stages file: {e}") from None
    except ValidationError as e:
        err = e.errors()[0]
        raise ConfigError(f"{path}: {'.'.join(str(p) for p in err['loc'])}: {err['msg']}") from None
    names = [s.name for s in spec.stages]
    if len(set(names)) != len(names):
        raise ConfigError(f"{path}: stages: the names {names} repeat; each stage needs its own")
    run_dir = Path(spec.run_dir)  # relative: to the working directory, as train.run_dir
    plans, first_model = [], None
    for i, stage in enumerate(spec.stages):
        folder = run_dir / f"{i}-{stage.name}"
        extra = [f"train.run_dir={folder}"]
        if i > 0:
            extra.append(f"model.path={first_model if for_plan else plans[-1].export}")
        if stage.rft is not None:
            if i == 0:
                raise ConfigError(f"{path}: stages.0 ({stage.name}): rft samples the previous stage's model; "
                                  f"the first stage has none")
            extra += [f"data.train.name={folder / 'kept.jsonl'}", "data.train.format=sft", "data.train.options={}"]
        overrides = [_stage_ref(o, plans, for_plan, first_model, path, i, stage) for o in stage.overrides]
        try:
            cfg = load_config(stage.recipe, [*overrides, *extra])
        except ConfigError as e:
            raise ConfigError(f"{path}: stages.{i} ({stage.name}): {e}") from None
        if stage.rft is not None and not cfg.objective_config.supervised:
            raise ConfigError(f"{path}: stages.{i} ({stage.name}): rft fine-tunes on the kept set: its recipe's "
                              f"objective must be sft, not {cfg.objective.name!r}")
        first_model = first_model or cfg.model.path
        plans.append(StagePlan(index=i, stage=stage, dir=folder, cfg=cfg))
    return plans


def _stage_ref(override: str, plans, for_plan, first_model, path, i, stage) -> str:
    """`key=stage:NAME` -> `key=<NAME's exported model>` (an earlier stage only)."""
    key, _, value = override.partition("=")
    if not value.startswith(STAGE_PREFIX):
        return override
    name = value[len(STAGE_PREFIX):]
    earlier = {p.stage.name: p for p in plans}
    if name not in earlier:
        raise ConfigError(f"{path}: stages.{i} ({stage.name}): {key}={value}: no earlier stage is named {name!r} "
                          f"(earlier: {sorted(earlier)})")
    return f"{key}={first_model if for_plan else earlier[name].export}"


def export_final(cfg: RunConfig, out: Path) -> None:
    """The run's newest checkpoint as a Hugging Face model in `out` (written beside it, then renamed:
    `out` exists only once complete)."""
    model, tokenizer, _ = load_trained_model(cfg, cfg.train.run_dir)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    generation = load_generation_config(resolve_path(cfg.model.path))  # the base's stop tokens and defaults
    save_pretrained(model, tmp, tokenizer=tokenizer, generation_config=generation)
    os.replace(tmp, out)


def combine_metrics(plans: list[StagePlan], run_dir: Path) -> Path:
    """`RUN_DIR/metrics.jsonl`: every stage's rows in order, `step` counted over the chain (rebuilt whole)."""
    lines, offset = [], 0
    for p in plans:
        if not (p.dir / "metrics.jsonl").exists():
            break
        rows = read_metrics(p.dir)
        for r in rows:
            lines.append(json.dumps({**r, "step": offset + r["step"], "stage": p.stage.name, "stage_index": p.index,
                                     "stage_step": r["step"]}))
        offset += max((r["step"] for r in rows), default=0)
    out = run_dir / "metrics.jsonl"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name("metrics.jsonl.tmp")
    tmp.write_text("".join(line + "\n" for line in lines))
    os.replace(tmp, out)
    return out


def run_stages(plans: list[StagePlan], *, say=print) -> dict:
    """Runs the stages not yet done, in order; returns the last stage's final metrics row."""
    last: dict = {}
    run_dir = plans[0].dir.parent
    for p in plans:
        if p.export.is_dir():
            say(f"[dapo-jax stages] {p.label}: done ({p.export})", flush=True)
            continue
        say(f"[dapo-jax stages] {p.label}: {p.cfg.objective.name} from {p.cfg.model.path}", flush=True)
        if p.stage.rft is not None and not p.kept.exists():
            _sample_kept(p, rejection_sample, say)
        last = loop.train(p.cfg)
        export_final(p.cfg, p.export)
        combine_metrics(plans, run_dir)
    combine_metrics(plans, run_dir)
    return last


def _sample_kept(p: StagePlan, rejection_sample, say) -> None:
    """The rft stage's data: the previous stage's model (this stage's model.path) sampled on `rft.prompts`,
    judged by this stage's reward functions."""
    rft = p.stage.rft
    cfg = p.cfg.model_copy(update={"data": p.cfg.data.model_copy(update={"train": rft.prompts})})
    mesh = build_mesh(cfg)
    with jax.set_mesh(mesh):
        tokenizer = load_tokenizer(cfg)
        model = load_model(cfg, mesh, tokenizer)
        stats = rejection_sample(cfg, model, tokenizer, out=p.kept, k=rft.k, per_prompt=rft.per_prompt,
                                 limit=rft.limit, mesh=mesh)
    say(f"[dapo-jax stages] {p.label}: kept {stats['kept']} of {stats['sampled']} sampled responses "
        f"({stats['prompts_kept']} of {stats['prompts']} prompts) -> {p.kept}", flush=True)
    if not stats["kept"]:
        p.kept.unlink()
        raise ConfigError(f"{p.label}: rejection sampling kept no response ({stats['sampled']} sampled): the model "
                          f"of the previous stage answers none right; raise rft.k or rft.limit")


__all__ = ["RftSection", "Stage", "StagePlan", "StagesFile", "combine_metrics", "export_final", "is_stages_file",
           "load_stages", "run_stages"]
