"""The programs a run compiles are the ones `dapo-jax plan` compiles (training/programs.py builds them for both)."""

import logging

import pytest

from dapo_jax.training.config import load_config


class _Compiles(logging.Handler):
    """(program name, input shapes and dtypes) of every program JAX lowers for compilation."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.seen: set[tuple[str, tuple[str, ...]]] = set()

    def emit(self, record):
        if str(record.msg).startswith("Compiling %s with global shapes and types"):
            self.seen.add((str(record.args[0]), tuple(str(a) for a in record.args[1])))


@pytest.fixture
def compiles():
    logger = logging.getLogger("jax._src.interpreters.pxla")
    handler, level, propagate = _Compiles(), logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)
    logger.propagate = propagate


@pytest.mark.slow
@pytest.mark.parametrize("config, extra", [
    ("configs/tiny_dapo.yaml", []),
    # the packed update's chunk programs, LoRA's frozen base and merged sampler, the recomputed log pi_old
    ("configs/tiny_dapo_lora.yaml", ["optim.packing=true", "rollout.recompute_old_logp=true"]),
])
def test_plan_compiles_the_programs_a_step_compiles(config, extra, compiles, tmp_path):
    from dapo_jax.training.loop import train
    from dapo_jax.training.plan import make_plan

    cfg = load_config(config, [f"train.run_dir={tmp_path / 'run'}", "train.steps=1", "train.progress=false",
                               "train.tensorboard=false", "train.checkpoint_every=0", "train.eval_every=0",
                               "data.eval_size=8", "rollout.max_gen_batches=2", *extra])
    plan = make_plan(cfg, cache=False)
    planned, compiles.seen = compiles.seen, set()
    train(cfg)  # one step, and the final evaluation
    ran = compiles.seen
    names = {name for name, _ in planned}
    assert {"jit(generate_fn)", "jit(prepare)"} <= names
    assert names & {"jit(step_fn)", "jit(add_chunk)"}, names
    assert planned <= ran, sorted(planned - ran)  # everything the plan compiled, the run compiled
    # and every program of those names the run compiled (each shape: each packed chunk height), the plan did
    # (jax.jit(lambda ...) programs share one name with the run's small host-side helpers: checked above only)
    named = {r for r in ran if r[0] in names - {"jit(<lambda>)"}}
    assert named <= planned, sorted(named - planned)
    assert {p.phase for p in plan.programs} == {"rollout", "eval rollout", "log-prob", "update"}
