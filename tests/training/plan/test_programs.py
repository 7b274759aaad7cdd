"""`dapo-jax plan` lowers the programs a run compiles, on the inputs the run gives them: every program of a tiny
run, lowered through the run's own path (`train` up to its compile-ahead: `Actor.precompile`,
`Learner.precompile`, the learned reward's device call) and through the plan's (`build_world(...).jobs()`),
is the same program (identical StableHLO text) on the same input shapes, dtypes and shardings."""

import hashlib
import re
from unittest import mock

import jax
import pytest

from dapo_jax.rewards.reward_model import LearnedReward
from dapo_jax.training import loop
from dapo_jax.training.config.resolve import resolve
from dapo_jax.training.config.run import load_config
from dapo_jax.training.plan.model_config import plan_model_config
from dapo_jax.training.plan.programs import build_world
from dapo_jax.training.update.compile_ahead import Program
from tests.rewards.conftest import make_rm


class Declared(Exception):
    """Stops `train` once the run has declared its programs: `lowered` maps each name to its `jax.stages.Lowered`."""

    def __init__(self, lowered, mesh):
        super().__init__("declared")
        self.lowered, self.mesh = lowered, mesh


class RunsTheJobs:
    """In place of the loop's `CompileAhead`: runs its jobs as the run does (the jobs' own code derives every
    input, compiling the programs whose outputs are inputs of the next), records each program instead of
    compiling it, scores through each learned reward once (its real device call, recorded too), and stops."""

    def __init__(self, jobs, *, context):
        lowered = {}
        actor = next(fn.func.__self__ for name, fn in jobs if name == "rollout")
        with context(), mock.patch.object(Program, "compile", lambda p: lowered.setdefault(p.name, p.lower())):
            pending = list(jobs)
            while pending:
                more = pending.pop(0)[1]()
                pending += more if isinstance(more, list) else []
            for i, (_, fn, _) in enumerate(actor.scorer.functions):
                if isinstance(fn, LearnedReward):
                    fn._fn = _Recorded(fn._fn, lowered, f"reward model {i}")
                    fn.score_rows(["1+1="], ["2"])
        raise Declared(lowered, actor.share.sharding.mesh)


class _Recorded:
    """A jitted function that records its first call's lowering under `name`, then runs."""

    def __init__(self, fn, lowered, name):
        self.fn, self.lowered, self.name = fn, lowered, name

    def __call__(self, *args):
        self.lowered.setdefault(self.name, self.fn.lower(*args))
        return self.fn(*args)


def _run_programs(cfg, monkeypatch):
    monkeypatch.setattr(loop, "CompileAhead", RunsTheJobs)
    with pytest.raises(Declared) as caught:
        loop.train(cfg)
    return caught.value


def _signature(lowered, mesh) -> tuple:
    """The program (a hash of its StableHLO text, which holds its inputs' shardings) and its inputs' shapes and
    dtypes. A mesh axis of size 1 is left out of the shardings: a compiled program gives its outputs'
    layouts without it (rows over ("fsdp",) where the plan writes ("data", "fsdp") with data=1), the same
    layout and the same partitioned program."""
    text = lowered.as_text()
    for axis, size in mesh.shape.items():
        if size == 1:
            text = re.sub(rf'"{axis}", |, "{axis}"|"{axis}"', "", text)
    avals = tuple((tuple(a.shape), str(a.dtype)) for a in jax.tree.leaves(lowered.in_avals))
    return hashlib.sha256(text.encode()).hexdigest()[:16], avals


LORA = ["lora.rank=4", "lora.alpha=8", "lora.targets=[q_proj, v_proj, gate_proj]"]


@pytest.mark.parametrize("extra", [
    ["optim.packing=false", "objective.name=skywork_or1"],  # the update unpacked, with α_k an input
    # the packed stages with LoRA's frozen base (π_ref = the base), the weights over tensor
    ["optim.packing=true", *LORA, "objective.kl_beta=0.01", "objective.kl_in=loss", "mesh.tensor=2", "mesh.data=1"],
    ["optim.packing=false", "objective.name=ppo", "rollout.recompute_old_logp=true"],  # a critic, π_old recomputed
    # each function's reward [P, G, K], one of them a learned reward model
    ["optim.packing=false", "objective.multi_reward=normalize_then_sum", "objective.overlong_buffer=null", "RM"],
    ["optim.packing=true", "TEACHER"],  # the packed stages on the full parameters; a distillation teacher
], ids=["unpacked-skywork", "packed-lora-tensor", "ppo", "multi-reward-rm", "packed-distill"])
def test_the_plan_lowers_every_program_the_run_declares(extra, tiny_model_dir, overrides_for, tmp_path, monkeypatch):
    extra = list(extra)
    if "RM" in extra:
        extra.remove("RM")
        orm = make_rm(tmp_path / "orm", "sequence")
        extra.append(f"reward.functions=[{{name: synthetic}}, {{name: reward_model, path: {orm}, weight: 0.5, "
                     "options: {batch_size: 6}}]")
    if "TEACHER" in extra:
        extra[extra.index("TEACHER")] = f"distill.teacher={tiny_model_dir}"
    keys = {"train.steps": 1, "mesh.data": 2, "mesh.fsdp": 2, **dict(e.split("=", 1) for e in extra)}
    cfg = resolve(load_config(None, overrides_for(tiny_model_dir, tmp_path / "run", **keys)))
    run = _run_programs(cfg, monkeypatch)
    model_cfg, _ = plan_model_config(cfg, None)
    with jax.set_mesh(run.mesh):
        jobs = {job.name: job for job in build_world(cfg, model_cfg, run.mesh).jobs()}
        planned = {name: job.lower() for name, job in jobs.items()}
    ran = run.lowered
    # the run compiles the evaluation's sampler when it first evaluates, not ahead: every other program planned
    assert set(planned) - {"eval rollout"} == set(ran), (sorted(planned), sorted(ran))
    if cfg.optim.packing:
        assert {"update: select", "update: start", "update: apply", "update: finish"} <= set(ran)
        assert sum(n.startswith("update: chunk") for n in ran) == 2  # R and the R/2 tail
    assert ("critic update" in ran) == (cfg.objective_config.uses_critic)
    assert ("teacher_params" in ran["prepare"].args_info[1]) == (cfg.distill is not None)
    assert any(n.startswith("reward model") for n in ran) == ("reward_model" in str(extra))
    for name in sorted(ran):
        assert _signature(planned[name], run.mesh) == _signature(ran[name], run.mesh), name
    # the text holds the inputs' layouts: the batch's rows over data x fsdp
    assert '{sdy.sharding = #sdy.sharding<@mesh, [{"data", "fsdp"}, {}]>}' in ran["prepare"].as_text()
    # the evaluation's sampler: the rollout's inputs (the same blank generation batch), its own sampling settings
    assert _signature(planned["eval rollout"], run.mesh)[1] == _signature(ran["rollout"], run.mesh)[1]
