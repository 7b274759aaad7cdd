"""The programs a run compiles are the ones `dapo-jax plan` compiles (training/update/programs.py builds them for both)."""

import logging

import pytest

from dapo_jax.training.config.run import load_config


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
    # each function's reward [P, G, K] and the weights into prepare (the plan once lowered [P, G] without them)
    ("configs/tiny_grpo.yaml", ["objective.multi_reward=normalize_then_sum",
                                "reward.functions=[{name: synthetic}, {name: synthetic, weight: 0.5}]"]),
])
def test_plan_compiles_the_programs_a_step_compiles(config, extra, compiles, tmp_path):
    from dapo_jax.training.loop import train
    from dapo_jax.training.plan.memory import make_plan

    cfg = load_config(config, [f"train.run_dir={tmp_path / 'run'}", "train.steps=1", "train.progress=false",
                               "train.tensorboard=false", "train.checkpoint_every=0", "train.eval_every=0",
                               "data.eval_size=8", "rollout.max_gen_batches=2", *extra])
    plan = make_plan(cfg, cache=False)
    planned, compiles.seen = compiles.seen, set()
    train(cfg)  # one step, and the final evaluation
    ran = compiles.seen
    names = {name for name, _ in planned}
    assert {"jit(generate_fn)", "jit(prepare)"} <= names
    assert names & {"jit(step_fn)", "jit(_add_chunk)"}, names  # the unpacked update, or the packed one's chunks
    assert planned <= ran, sorted(planned - ran)  # everything the plan compiled, the run compiled
    # and every program of those names the run compiled (each shape: each packed chunk height), the plan did
    # (jax.jit(lambda ...) programs share one name with the run's small host-side helpers: checked above only)
    named = {r for r in ran if r[0] in names - {"jit(<lambda>)"}}
    assert named <= planned, sorted(named - planned)
    assert {p.phase for p in plan.programs} == {"rollout", "eval rollout", "log-prob", "update"}


# --------------------------------------------------------------------------- the log-prob passes in chunks
P, G, S, T, V = 8, 2, 5, 7, 32


def _tiny(seed, layers=1):
    from flax import nnx

    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder

    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def _rollout(seed=0):
    """Host arrays of a rollout batch: left-padded prompts, responses of every length (some empty)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    pmask = np.ones((P, S), np.int32)
    pmask[0, :2] = pmask[5, :4] = 0
    lengths = rng.integers(0, T + 1, size=(P, G))
    rmask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    return (rng.integers(0, V, (P, S)).astype(np.int32), pmask, rng.integers(0, V, (P, G, T)).astype(np.int32), rmask,
            (np.log(1 / V) + 0.2 * rng.normal(size=(P, G, T)) * rmask).astype(np.float32),
            rng.choice([0.0, 1.0], (P, G)).astype(np.float32), rng.random((P, G)) < 0.9)


@pytest.mark.parametrize("chunks, mesh_shape", [(2, None), (8, None), (4, (1, 2, 2))])
def test_prepare_in_chunks_equals_one_pass(chunks, mesh_shape):
    """log π_old, log π_ref, the KL they give (here in the reward) and the advantages are the same whether
    the forward passes take the whole batch or `chunks` slices of its prompts, alone or with the rows
    over fsdp=2 (and the weights over tensor=2): rows never attend to each other."""
    import contextlib

    import jax
    import numpy as np
    from flax import nnx

    from dapo_jax.models.sharding import shard_model
    from dapo_jax.objectives.config import ObjectiveConfig
    from dapo_jax.parallel.mesh import batch_sharding, make_mesh
    from dapo_jax.training.update.programs import make_prepare
    from dapo_jax.training.update.train_step import make_logprob_fn

    objective = ObjectiveConfig(kl_beta=0.1, kl_in="reward", advantage="reinforce_pp_baseline")
    policy, ref = _tiny(0), _tiny(1)
    mesh = None if mesh_shape is None else make_mesh(*mesh_shape, devices=jax.devices()[:4])
    host = _rollout()
    if mesh is not None:
        shard_model(policy, mesh)
        shard_model(ref, mesh)
    graphdef, params = nnx.split(policy)
    ref_params = nnx.split(ref)[1]
    logprob = make_logprob_fn(graphdef, temperature=0.7)
    out = {}
    for n in (1, chunks):
        prepare = make_prepare(objective, logprob, recompute_old_logp=True, chunks=n)
        args = host if mesh is None else jax.device_put(host, batch_sharding(mesh))
        with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):  # as the loop runs it
            out[n] = prepare(params, ref_params, *args)[0]
    whole, parts = out[1], out[chunks]
    assert whole.advantages.ndim == 3 and float(np.abs(np.asarray(whole.advantages)).max()) > 0
    assert float(np.abs(np.asarray(whole.ref_logp) - np.asarray(whole.old_logp)).max()) > 1e-3  # two models
    for name in ("old_logp", "ref_logp", "advantages"):
        np.testing.assert_allclose(np.asarray(getattr(parts, name)), np.asarray(getattr(whole, name)), rtol=1e-5,
                                   atol=1e-6, err_msg=name)
    if mesh is not None:
        assert parts.old_logp.sharding.is_equivalent_to(batch_sharding(mesh), 3)


def test_critic_values_in_chunks_equal_one_pass():
    """The critic's value pass in the prepare step, whole or in 4 chunks of prompts: the same values,
    GAE advantages and targets."""
    import jax.numpy as jnp
    import numpy as np
    from flax import nnx

    from dapo_jax.models.value_head import ValueModel
    from dapo_jax.objectives.config import ObjectiveConfig
    from dapo_jax.training.update.critic import Critic
    from dapo_jax.training.update.train_step import Batch

    objective = ObjectiveConfig(advantage="gae", critic_lambda=0.95)
    graphdef, params = nnx.split(ValueModel(_tiny(2), rngs=nnx.Rngs(3)))
    critic = Critic(objective, graphdef, None, None, 1, 1)
    ids, pmask, rids, rmask, old, rewards, valid = map(jnp.asarray, _rollout(1))
    batch = Batch(ids, pmask, rids, rmask, old, None, jnp.zeros_like(old))
    out = {n: critic.prepare(params, batch, rewards, valid, valid, chunks=n) for n in (1, 4)}
    assert float(jnp.abs(out[1][1].old_values).max()) > 0
    for a, b in zip(jax_leaves(out[4]), jax_leaves(out[1])):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def jax_leaves(tree):
    import jax
    import numpy as np

    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_chunked_prepare_needs_a_fraction_of_the_memory():
    """Compiled memory (not a timing): at 4 chunks the prepare step's temporaries are well under half of
    one pass's (the reference attention's [B, S, S] blocks and the activations are a chunk's)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dapo_jax.objectives.config import ObjectiveConfig
    from dapo_jax.training.update.programs import make_prepare
    from dapo_jax.training.update.train_step import make_logprob_fn

    graphdef, params = nnx.split(_tiny(0))
    logprob = make_logprob_fn(graphdef, temperature=1.0)
    p, g, t = 16, 4, 200
    sds = jax.ShapeDtypeStruct
    args = (sds((p, S), jnp.int32), sds((p, S), jnp.int32), sds((p, g, t), jnp.int32), sds((p, g, t), jnp.float32),
            sds((p, g, t), jnp.float32), sds((p, g), jnp.float32), sds((p, g), jnp.bool_))
    temps = {}
    for n in (1, 4):
        prepare = make_prepare(ObjectiveConfig(), logprob, recompute_old_logp=True, chunks=n)
        temps[n] = prepare.lower(params, None, *args).compile().memory_analysis().temp_size_in_bytes
    assert temps[4] < 0.4 * temps[1], temps


# --------------------------------------------------------------------------- one declaration, two paths
def _run_and_plan(config, extra):
    """The run's objects as `train` builds them (the model loaded, its weights on the mesh) and the plan's
    abstract world, for one resolved config; both take `prepare`'s inputs from `RunPrograms.prepare_inputs`
    on `RunPrograms.blank()`."""
    import jax

    from dapo_jax.parallel.mesh import batch_sharding, committed
    from dapo_jax.training.build import build_mesh, load_model, load_tokenizer, sampling_config
    from dapo_jax.training.config.resolve import resolve
    from dapo_jax.training.update.critic import Critic
    from dapo_jax.training.update.lora import PolicyWeights
    from dapo_jax.training.plan.programs import build_world
    from dapo_jax.training.update.programs import build_programs, run_optimizer
    from dapo_jax.training.step import Learner
    from dapo_jax.training.update.train_step import init_train_state

    cfg = resolve(load_config(config, ["data.eval=null", "mesh.fsdp=2", *extra]))  # rows over 2 devices
    objective = cfg.objective_config
    mesh = build_mesh(cfg)
    with jax.set_mesh(mesh):
        tokenizer = load_tokenizer(cfg)
        model = load_model(cfg, mesh, tokenizer)
        policy, params = PolicyWeights.build(model, cfg.lora, seed=cfg.train.seed, mesh=mesh)
        tx, schedule = run_optimizer(cfg)
        state = committed(init_train_state(params, tx))  # laid out as the update hands it back (parallel/mesh.py)
        critic = Critic.build(cfg, mesh) if objective.uses_critic else None
        programs = build_programs(cfg, policy=policy, model_cfg=model.config, mesh=mesh, tx=tx, schedule=schedule,
                                  scfg=sampling_config(cfg, tokenizer, model.config),
                                  eval_scfg=sampling_config(cfg, tokenizer, model.config, eval_mode=True),
                                  critic=critic, reward_weights=tuple(float(f.weight) for f in cfg.reward.functions))
        learner = Learner(programs, policy, policy.reference(params) if objective.needs_reference else None,
                          batch_sharding(mesh))
        world = build_world(cfg, model.config, mesh)
    return cfg, mesh, learner, state, None if critic is None else committed(critic.init_state), world


def _specs(tree):
    """(path, shape, dtype, sharding) of every array of `tree` (arrays or ShapeDtypeStructs)."""
    import jax

    out = []
    for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]:
        if hasattr(x, "shape"):
            out.append((jax.tree_util.keystr(path), tuple(x.shape), str(x.dtype), getattr(x, "sharding", None)))
    return out


def _program(lowered) -> str:
    """A lowered program's text without its arguments' sharding annotations (compared on their own)."""
    import re

    return re.sub(r"sdy\.sharding = #sdy\.sharding<[^>]*>", "", lowered.as_text())


def _assert_same_inputs(run, plan, what):
    a, b = _specs(run), _specs(plan)
    assert [x[:3] for x in a] == [x[:3] for x in b], what
    for (path, shape, _, s1), (_, _, _, s2) in zip(a, b):
        assert s1 is not None and s2 is not None and s1.is_equivalent_to(s2, len(shape)), (what, path, s1, s2)


@pytest.mark.slow
@pytest.mark.parametrize("config, extra", [
    ("tiny_dapo", ["optim.packing=false"]),
    ("tiny_dapo", ["optim.packing=true"]),
    ("tiny_ppo", ["optim.packing=false"]),  # the critic: its params and `correct` into prepare, its update
    ("tiny_grpo", ["objective.multi_reward=normalize_then_sum", "optim.packing=false",
                   "reward.functions=[{name: synthetic}, {name: synthetic, weight: 0.5}]"]),
    ("tiny_dapo_lora", ["optim.packing=false", "rollout.recompute_old_logp=true"]),  # the frozen base, pi_old
], ids=["unpacked", "packed", "critic", "normalize_then_sum", "lora"])
def test_the_run_and_the_plan_lower_the_same_prepare_and_update(config, extra):
    """`prepare` and the update (and the critic's update) on the inputs the run gives them (its weights, its
    batch laid out over the mesh, the update's batch as `prepare` hands it back) and on the plan's abstract
    ones: the same shapes, dtypes and shardings, and the same lowered program."""
    import jax

    from dapo_jax.training.update.compile_ahead import abstract, compiled_outputs

    cfg, mesh, learner, state, critic_state, world = _run_and_plan(config, extra)
    jobs = {job.name: job for job in world.jobs()}
    with jax.set_mesh(mesh):
        args, kwargs = learner._prepare_inputs(state.params, learner.programs.blank(), critic_state)
        plan = jobs["prepare"]
        _assert_same_inputs(abstract((args, kwargs)), (plan.args, plan.kwargs), "prepare")
        if cfg.objective_config.sums_normalised_rewards:  # each function's reward: [P, G, K]
            assert args[7].shape == (cfg.rollout.train_batch, cfg.rollout.G, 2)
        assert _program(learner.programs.prepare.lower(*args, **kwargs)) == _program(plan.lower())
        batch, critic_batch = compiled_outputs(learner.programs.prepare, *args, **kwargs)
        if cfg.optim.packing:  # its stages: the plan's first chunk takes the batch's rows and chunk layout
            stages = [name for name in jobs if name.startswith("update: chunk")]
            assert stages and "update" not in jobs
            _assert_same_inputs(batch, jobs["update: select"].args[0], "update: select")
        else:
            kw = learner.policy.step_kwargs
            plan = jobs["update"]
            _assert_same_inputs(abstract(((state, batch), kw)), (plan.args, plan.kwargs), "update")
            assert _program(learner.programs.train_step.lower(state, batch, **kw)) == _program(plan.lower())
        if critic_state is not None:
            plan = jobs["critic update"]
            _assert_same_inputs((abstract(critic_state), critic_batch), plan.args, "critic update")
            assert _program(learner.programs.critic.update.lower(critic_state, critic_batch)) == _program(plan.lower())


@pytest.mark.parametrize("attention, share_prompts, packing, shared", [
    ("reference", True, True, True),  # the CPU's attentions take a group's shared prompt (branch ids); splash and
    ("blockwise", True, True, True),  # gpu_flash cannot (an accelerator's: not resolvable on a CPU mesh)
    ("reference", False, True, False),  # optim.packing_share_prompts=false
    ("reference", True, False, False),  # unpacked: nothing to share
])
def test_make_update_shares_prompts_only_where_the_attention_branches(attention, share_prompts, packing, shared):
    """The update the run and the benchmarks build (`make_update`): packed or not by `optim.packing`, a group's
    prompt shared only when the attention can branch (models/attention.py's `supports_branches`)."""
    import jax
    from flax import nnx

    from dapo_jax.models.attention import resolve, supports_branches
    from dapo_jax.objectives.config import ObjectiveConfig
    from dapo_jax.parallel.mesh import make_mesh
    from dapo_jax.training.config.sections import OptimSection
    from dapo_jax.training.update.programs import make_update
    from dapo_jax.training.update.train_step import make_optimizer

    assert supports_branches(resolve(attention, platform="cpu", seq_len=12))
    assert not supports_branches("splash") and not supports_branches("gpu_flash")
    optim = OptimSection(packing=packing, packing_share_prompts=share_prompts)
    tx, schedule = make_optimizer(optim)
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    step, share = make_update(nnx.split(_tiny(0))[0], tx, schedule, objective=ObjectiveConfig(), optim=optim,
                              temperature=1.0, mesh=mesh, attention=attention, seq_len=12)
    assert share is shared
    assert hasattr(step, "packing_stats") is packing  # the packed step's own counters
    with pytest.raises(ValueError, match="resolve"):
        make_update(None, tx, schedule, objective=ObjectiveConfig(), optim=OptimSection(), temperature=1.0, mesh=mesh,
                    attention=attention, seq_len=12)


def test_the_plan_lowers_continuous_batchings_programs_with_the_streams_inputs():
    """With `rollout.continuous` the plan lowers the sampler's admit and decode programs on the inputs
    `ContinuousSampler.programs` declares: `refill` prompts of the stream's prompt width into the row slots."""
    import jax

    from dapo_jax.models.config import ModelConfig
    from dapo_jax.parallel.mesh import make_mesh
    from dapo_jax.training.config.resolve import resolve
    from dapo_jax.training.plan.programs import build_world

    cfg = resolve(load_config("tiny_dapo", ["rollout.continuous=true", "data.eval=null"]))
    model_cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                            num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2, head_dim=8)
    world = build_world(cfg, model_cfg, make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    jobs = {job.name: job for job in world.jobs()}
    assert "rollout" not in jobs
    cont = world.programs.continuous
    admit, decode = jobs["rollout: admit"], jobs["rollout: decode"]
    ids = admit.args[3]
    assert ids.shape == (cont.refill, cfg.data.max_prompt_length) and admit.args[2].shape == (cont.refill * cfg.rollout.G,)
    slots = jax.tree.leaves(admit.args[1])
    assert slots and all(x.shape[0] == cfg.rollout.gen_batch * cfg.rollout.G for x in slots if x.ndim)
    for job in (admit, decode):
        assert "stablehlo" in job.lower().as_text()
