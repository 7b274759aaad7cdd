"""The jitted update: micro-batch accumulation is exact, non-finite updates are skipped, AdamW + schedule."""

import contextlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.training.config.sections import OptimSection
from dapo_jax.training.update.train_step import Batch, init_train_state, make_optimizer, make_schedule, make_train_step

P, G, S, T, V = 4, 3, 5, 6, 32


def tiny_model(seed=0):
    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def token_mean_surrogate(cfg, *, logp, old_logp, advantages, mask, ref_logp=None, entropy=None):
    """Independent reference: PPO clipped surrogate, token-mean as (Σℓm, Σm)."""
    ratio = jnp.exp(logp - old_logp)
    loss = -jnp.minimum(ratio * advantages, jnp.clip(ratio, 0.8, 1.28) * advantages)
    m = mask.astype(jnp.float32)
    metrics = {"ratio_mean": (jnp.sum(ratio * m), jnp.sum(m)), "ratio_max": (jnp.max(jnp.where(m > 0, ratio, -jnp.inf)), jnp.sum(m))}
    return jnp.sum(loss * m), jnp.sum(m), metrics


def make_batch(seed=0, old_shift=0.0):
    rng = np.random.default_rng(seed)
    prompt_mask = np.ones((P, S), np.int32)
    prompt_mask[0, :2] = 0  # left padding
    resp_mask = np.zeros((P, G, T), np.float32)
    lengths = rng.integers(1, T + 1, size=(P, G))
    for p in range(P):
        for g in range(G):
            resp_mask[p, g, : lengths[p, g]] = 1
    adv = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2).astype(np.float32)
    return Batch(
        prompt_ids=jnp.asarray(rng.integers(0, V, (P, S)), jnp.int32),
        prompt_mask=jnp.asarray(prompt_mask),
        response_ids=jnp.asarray(rng.integers(0, V, (P, G, T)), jnp.int32),
        response_mask=jnp.asarray(resp_mask),
        old_logp=jnp.asarray(np.log(1.0 / V) + old_shift * rng.normal(size=(P, G, T)) * resp_mask, jnp.float32),
        advantages=jnp.asarray(adv),
        ref_logp=jnp.zeros((P, G, T), jnp.float32),
    )


_STEPS = {}


def run(num_minibatches, micro_batches, batch, *, steps=1):
    """A fresh tiny model updated `steps` times (compiled steps are shared between tests)."""
    graphdef, params = nnx.split(tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))
    key = (num_minibatches, micro_batches)
    if key not in _STEPS:
        _STEPS[key] = make_train_step(graphdef, tx, schedule, objective=None, num_minibatches=num_minibatches,
                                      micro_batches=micro_batches, loss_terms=token_mean_surrogate)
    state = init_train_state(params, tx)
    for _ in range(steps):
        state, metrics = _STEPS[key](state, batch)
    return state, metrics, graphdef


def reference_update(batch, lr=1e-2):
    """Whole-batch gradient of Σℓm/Σm by plain jax.grad, then one Adam step written out."""
    model = tiny_model()
    graphdef, params = nnx.split(model)

    def loss(params):
        m = nnx.merge(graphdef, params)
        from dapo_jax.models.logprobs import response_logprobs
        logp, _ = response_logprobs(m, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                    batch.response_mask, temperature=1.0)
        s, d, _ = token_mean_surrogate(None, logp=logp, old_logp=batch.old_logp, advantages=batch.advantages,
                                       mask=batch.response_mask)
        return s / d

    grads = jax.jit(jax.grad(loss))(params)
    # Adam's first step: m/(sqrt(v)+eps) = g/(|g|+eps) (bias-corrected), so Δ = -lr * g/(|g|+eps).
    return jax.tree.map(lambda p, g: p - lr * g / (jnp.abs(g) + 1e-8), params, grads), grads


def leaves(tree):
    return [np.asarray(x) for x in jax.tree.leaves(tree)]


def test_micro_batches_match_whole_batch_value_and_update():
    batch = make_batch(old_shift=0.3)
    whole, m_whole, _ = run(1, 1, batch)
    micro, m_micro, _ = run(1, 4, batch)
    np.testing.assert_allclose(m_whole["loss"], m_micro["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m_whole["grad_norm"], m_micro["grad_norm"], rtol=1e-5)
    # Adam divides by |g|: float32 summation-order noise on tiny gradient entries shows at 1e-5 of lr=1e-2.
    for a, b in zip(leaves(whole.params), leaves(micro.params)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
    expected, grads = reference_update(batch)
    np.testing.assert_allclose(m_whole["grad_norm"], optax.tree.norm(grads), rtol=1e-5)
    for a, b in zip(leaves(whole.params), leaves(expected)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5)
    assert int(whole.step) == 1 and int(whole.skipped) == 0


def test_minibatches_take_several_optimizer_steps():
    batch = make_batch()
    state, metrics, _ = run(2, 2, batch)
    assert int(state.step) == 2
    # The first mini-batch is on-policy when old_logp = the current policy's: here it is not, but
    # the update must still move the parameters.
    before = leaves(nnx.split(tiny_model())[1])
    assert any(not np.allclose(a, b) for a, b in zip(before, leaves(state.params)))


def test_non_finite_gradient_skips_update_and_is_counted():
    batch = make_batch()
    bad = batch._replace(advantages=batch.advantages.at[0, 0, 0].set(jnp.nan))
    state, metrics, _ = run(1, 4, bad)
    before = leaves(nnx.split(tiny_model())[1])
    for a, b in zip(before, leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    assert int(state.skipped) == 1 and float(metrics["update_applied"]) == 0.0
    mu = [np.asarray(x) for x in jax.tree.leaves(state.opt_state) if np.ndim(x) > 0]
    assert all(np.all(np.isfinite(x)) for x in mu) and all(np.all(x == 0) for x in mu)


def test_fully_masked_batch_does_not_move_params():
    batch = make_batch()
    empty = batch._replace(response_mask=jnp.zeros_like(batch.response_mask))
    state, metrics, _ = run(1, 4, empty)
    for a, b in zip(leaves(nnx.split(tiny_model())[1]), leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    assert int(state.skipped) == 0


@pytest.mark.parametrize("schedule", ["constant", "cosine"])
def test_schedule_warmup_then_constant_or_cosine(schedule):
    optim = OptimSection(lr=1.0, warmup_steps=4, schedule=schedule, min_lr_ratio=0.1)
    sched = make_schedule(optim, decay_steps=10)
    np.testing.assert_allclose([sched(i) for i in range(5)], [0, 0.25, 0.5, 0.75, 1.0], atol=1e-6)
    if schedule == "constant":
        np.testing.assert_allclose(sched(100), 1.0)
    else:
        np.testing.assert_allclose(sched(4 + 5), 0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * 0.5)), rtol=1e-5)
        np.testing.assert_allclose(sched(4 + 10), 0.1, rtol=1e-5)


def test_no_recompilation_across_steps():
    from dapo_jax.training.metrics import compile_count

    state, _, _ = run(2, 2, make_batch(), steps=2)
    batches = [make_batch(seed=1), make_batch(seed=2)]  # built first: only the steps are counted
    before = compile_count()
    for batch in batches:
        state, _ = _STEPS[(2, 2)](state, batch)
    assert compile_count() == before


def _fresh_state_and_step(lr):
    graphdef, params = nnx.split(tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))
    if lr is not None:  # the config refuses inf; build the transform directly, as a bug or overflow would
        tx, schedule = optax.adam(lr), optax.constant_schedule(lr)
    step = make_train_step(graphdef, tx, schedule, objective=None, loss_terms=token_mean_surrogate)
    return init_train_state(params, tx), step


def test_infinite_learning_rate_never_reaches_the_params():
    state, step = _fresh_state_and_step(lr=float("inf"))
    before = leaves(state.params)
    state, metrics = step(state, make_batch())
    for a, b in zip(before, leaves(state.params)):
        np.testing.assert_array_equal(a, b)
    assert float(metrics["nonfinite_updates"]) == 1.0 and float(metrics["update_applied"]) == 0.0
    assert int(state.skipped) == 1
    assert all(np.all(np.isfinite(x)) for x in leaves(state.opt_state) if np.issubdtype(x.dtype, np.floating))


def test_nan_optimizer_moment_is_never_applied_and_keeps_being_reported():
    state, step = _fresh_state_and_step(lr=None)
    # A damaged optimizer state: one NaN in one first moment (as a flipped checkpoint byte would give).
    flat, treedef = jax.tree.flatten(state.opt_state)
    i = next(k for k, x in enumerate(flat) if np.ndim(x) > 0)
    flat[i] = flat[i].at[(0,) * flat[i].ndim].set(jnp.nan)
    state = state._replace(opt_state=jax.tree.unflatten(treedef, flat))
    before = leaves(state.params)
    for n in range(1, 3):
        state, metrics = step(state, make_batch(seed=n))
        assert float(metrics["nonfinite_updates"]) == 1.0
        assert int(state.skipped) == n
    for a, b in zip(before, leaves(state.params)):
        np.testing.assert_array_equal(a, b)


def test_finite_update_reports_zero_nonfinite():
    state, step = _fresh_state_and_step(lr=None)
    state, metrics = step(state, make_batch())
    assert float(metrics["nonfinite_updates"]) == 0.0 and float(metrics["update_applied"]) == 1.0


def test_high_entropy_mask_is_taken_over_the_whole_update_batch():
    """The 80/20 mask keeps the top-q entropy tokens of the whole mini-batch: the update must not change
    with micro_batches (it did, by up to 2.8e-2 in the gradient, when the quantile was per micro-batch)."""
    from dapo_jax.models.logprobs import response_logprobs
    from dapo_jax.objectives.config import ObjectiveConfig

    objective = ObjectiveConfig(high_entropy_quantile=0.4, eps_low=0.2, eps_high=0.28)
    batch = make_batch(seed=3, old_shift=0.3)
    graphdef, params = nnx.split(tiny_model())
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))
    got = {}
    for micro in (1, 2, 4):
        step = make_train_step(graphdef, tx, schedule, objective=objective, micro_batches=micro)
        state, metrics = step(init_train_state(nnx.split(tiny_model())[1], tx), batch)
        got[micro] = (float(metrics["grad_norm"]), leaves(state.params))

    # reference: entropies of the whole batch, numpy's quantile over its valid tokens, then the
    # clipped surrogate's token mean over the kept tokens, differentiated by plain jax.grad
    model = nnx.merge(graphdef, params)
    mask = np.asarray(batch.response_mask)
    _, entropy = response_logprobs(model, batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                                   batch.response_mask, temperature=1.0)
    entropy = np.asarray(entropy)
    keep = mask * (entropy >= np.quantile(entropy[mask > 0], 1 - 0.4))
    assert 0 < keep.sum() < mask.sum()

    def loss(params):
        logp, _ = response_logprobs(nnx.merge(graphdef, params), batch.prompt_ids, batch.prompt_mask,
                                    batch.response_ids, batch.response_mask, temperature=1.0)
        ratio = jnp.exp(logp - batch.old_logp)
        adv = batch.advantages
        ell = -jnp.minimum(ratio * adv, jnp.clip(ratio, 0.8, 1.28) * adv)
        return jnp.sum(ell * keep) / keep.sum()

    grads = jax.grad(loss)(params)
    for micro, (grad_norm, new_params) in got.items():
        np.testing.assert_allclose(grad_norm, float(optax.tree.norm(grads)), rtol=1e-4, err_msg=f"micro_batches={micro}")
        for a, b in zip(new_params, got[1][1]):
            np.testing.assert_allclose(a, b, rtol=1e-4, atol=2e-5, err_msg=f"micro_batches={micro}")


def test_layer_scan_update_on_a_mesh_equals_the_layer_loop_on_one_device():
    """remat = full runs the blocks as one lax.scan over their stacked weights (models/decoder.py). One
    update of a 3-layer model that way, sharded over fsdp=2 x tensor=2 with 2 micro-batches, equals
    the layer loop's on one device."""
    from dapo_jax.models.sharding import shard_model
    from dapo_jax.parallel.mesh import batch_sharding, make_mesh

    cfg = tiny_model().config.replace(num_hidden_layers=3, num_key_value_heads=2)
    batch = make_batch(old_shift=0.3)
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.0, grad_clip=None))
    results = {}
    for remat, mesh in (("none", None), ("full", make_mesh(fsdp=2, tensor=2, devices=jax.devices()[:4]))):
        model = Decoder(cfg.replace(remat=remat), rngs=nnx.Rngs(0))
        b = batch
        if mesh is not None:
            shard_model(model, mesh)
            b = jax.tree.map(lambda x: jax.device_put(x, batch_sharding(mesh)), batch)
        graphdef, params = nnx.split(model)
        step = make_train_step(graphdef, tx, schedule, objective=None, num_minibatches=1, micro_batches=2,
                               loss_terms=token_mean_surrogate)
        with contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh):  # as the loop runs it
            results[remat] = step(init_train_state(params, tx), b)
    (loop, m_loop), (scan, m_scan) = results["none"], results["full"]
    np.testing.assert_allclose(m_scan["loss"], m_loop["loss"], rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(m_scan["grad_norm"], m_loop["grad_norm"], rtol=1e-5)
    assert len(jax.tree.leaves(scan.params)) == len(jax.tree.leaves(loop.params))
    for a, b in zip(leaves(loop.params), leaves(scan.params)):
        np.testing.assert_allclose(b, a, rtol=1e-4, atol=2e-5)
    assert any(not x.sharding.is_fully_replicated for x in jax.tree.leaves(scan.params))


def test_tied_entropies_keep_the_same_tokens_at_every_micro_batching_and_on_a_mesh():
    """The high-entropy mask under ties (issue: 8 of 22 tokens kept with one micro-batch, 5 with two,
    when the threshold came from one pass and the compared entropies from the gradient pass). The
    threshold falls on a G-way tie of first-token entropies: every tied token is kept, and the loss,
    the kept fraction and the update equal the whole batch's NumPy float64 reference at micro_batches
    1, 2 and 4 and on a 2-device mesh."""
    from jax.sharding import NamedSharding, PartitionSpec

    from dapo_jax.objectives.config import ObjectiveConfig
    from dapo_jax.parallel.mesh import batch_sharding, make_mesh
    from tests.training.update import entropy_ties as ties

    model = ties.model()
    batch = ties.batch(model.config.vocab_size)
    ref = ties.reference(model, batch)
    assert ref["ties_kept"] == ties.G and 0 < ref["kept_fraction"] < 1
    objective = ObjectiveConfig(high_entropy_quantile=ref["q"], eps_low=ties.EPS_LOW, eps_high=ties.EPS_HIGH)
    graphdef, params = nnx.split(model)
    tx = optax.sgd(0.1)  # new params = params - 0.1 * grad

    def ref_loss(params):  # the reference mask, differentiated by plain jax.grad over the whole batch
        from dapo_jax.models.logprobs import response_logprobs

        logp, _ = response_logprobs(nnx.merge(graphdef, params), batch.prompt_ids, batch.prompt_mask,
                                    batch.response_ids, batch.response_mask, temperature=1.0)
        ratio = jnp.exp(logp - batch.old_logp)
        adv = batch.advantages
        ell = -jnp.minimum(ratio * adv, jnp.clip(ratio, 1 - ties.EPS_LOW, 1 + ties.EPS_HIGH) * adv)
        return jnp.sum(ell * ref["keep"]) / ref["keep"].sum()

    expected = leaves(jax.tree.map(lambda p, g: p - 0.1 * g, params, jax.grad(ref_loss)(params)))
    mesh = make_mesh(1, 2, 1, devices=jax.devices()[:2])
    for micro, on_mesh in ((1, False), (2, False), (4, False), (2, True)):
        state = init_train_state(jax.tree.map(jnp.copy, params), tx)
        b = batch
        if on_mesh:
            state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
            b = jax.device_put(batch, batch_sharding(mesh))
        step = make_train_step(graphdef, tx, optax.constant_schedule(0.1), objective=objective, micro_batches=micro)
        with jax.set_mesh(mesh) if on_mesh else contextlib.nullcontext():
            state, metrics = step(state, b)
        where = f"micro_batches={micro}{' on 2 devices' if on_mesh else ''}"
        np.testing.assert_allclose(float(metrics["high_entropy_kept"]), ref["kept_fraction"], rtol=1e-6, err_msg=where)
        np.testing.assert_allclose(float(metrics["loss"]), ref["loss"], rtol=1e-4, err_msg=where)
        for a, b_ in zip(leaves(state.params), expected):
            np.testing.assert_allclose(a, b_, rtol=1e-4, atol=1e-6, err_msg=where)


def test_map_prompt_chunks_takes_the_update_split_and_puts_rows_back():
    """Chunk j holds prompts j, j + chunks, ... (as `_split`'s micro-batches); outputs come back in prompt order."""
    from dapo_jax.training.update.train_step import map_prompt_chunks

    x = jnp.arange(12)
    first = map_prompt_chunks(lambda c: jnp.broadcast_to(c.min(), c.shape), 4, x)  # each row: its chunk's first prompt
    np.testing.assert_array_equal(first, np.arange(12) % 4)
    pairs = map_prompt_chunks(lambda a, b: (a * 2, b[:, ::-1]), 3, x, jnp.arange(24).reshape(12, 2))
    np.testing.assert_array_equal(pairs[0], np.arange(12) * 2)
    np.testing.assert_array_equal(pairs[1], np.arange(24).reshape(12, 2)[:, ::-1])
    with pytest.raises(ValueError, match="12 prompts do not split into 5 chunks"):
        map_prompt_chunks(lambda c: c, 5, x)
