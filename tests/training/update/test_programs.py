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
