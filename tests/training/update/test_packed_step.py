"""The packed (padding-free) update equals the unpacked one: loss, gradient, new params, metrics."""

import contextlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.metrics import compile_count
from dapo_jax.training.update.packed_step import (PackedUpdate, default_chunk_rows, default_tail_rows,
                                          packed_logprobs, packing_stats)
from dapo_jax.training.update.train_step import Batch, init_train_state, make_train_step

P, G, S, T, V = 4, 3, 5, 6, 32
ROOT = Path(__file__).resolve().parents[3]


def tiny_model(seed=0):
    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def make_batch(seed=0, max_len=T):
    """Ragged prompts and responses; group 1 has zero advantage (zero spread), group 2 no token at all."""
    rng = np.random.default_rng(seed)
    prompt_mask = (np.arange(S) >= rng.integers(0, S - 1, P)[:, None]).astype(np.int32)
    lengths = rng.integers(1, max_len + 1, (P, G))
    resp_mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    resp_mask[2] = 0
    adv = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2).astype(np.float32) * resp_mask
    adv[1] = 0
    noise = lambda: rng.normal(size=(P, G, T)) * resp_mask  # noqa: E731
    old = np.log(1.0 / V) + 0.3 * noise()
    return Batch(
        prompt_ids=jnp.asarray(rng.integers(1, V, (P, S)), jnp.int32), prompt_mask=jnp.asarray(prompt_mask),
        response_ids=jnp.asarray(rng.integers(1, V, (P, G, T)), jnp.int32), response_mask=jnp.asarray(resp_mask),
        old_logp=jnp.asarray(old, jnp.float32), advantages=jnp.asarray(adv),
        ref_logp=jnp.asarray(np.log(1.0 / V) + 0.2 * noise(), jnp.float32),
        behaviour_logp=jnp.asarray(old + 0.2 * noise(), jnp.float32),
        nll_weight=jnp.asarray((adv > 0) * resp_mask, jnp.float32),
    )


def _steps(objective, n, m, rows):
    graphdef, params = nnx.split(tiny_model())
    tx = optax.sgd(0.1)  # new params = params - 0.1 * grad: comparing them compares the gradients
    schedule = optax.constant_schedule(0.1)
    kw = dict(objective=objective, num_minibatches=n, micro_batches=m,
              use_ref=objective.needs_reference and objective.kl_in == "loss")
    return (params, tx, make_train_step(graphdef, tx, schedule, **kw),
            PackedUpdate(graphdef, tx, schedule, chunk_rows=rows, **kw))


def _fields(objective, batch):
    return batch._replace(behaviour_logp=batch.behaviour_logp if objective.needs_behaviour_logp else None,
                          nll_weight=batch.nll_weight if objective.nll_coef > 0 else None)


CASES = [  # (recipe, overrides, num_minibatches, micro_batches, chunk rows: None = default_chunk_rows)
    ("dapo", {}, 2, 1, G),
    ("grpo", {}, 1, 2, None),  # KL (k3) in the loss, seq-mean-token-mean
    ("dr_grpo", {"max_response_length": T}, 1, 1, G),  # constant normaliser
    ("dapo", {"loss_agg": "group_mean_token_mean"}, 1, 2, G),  # DAPO's per-group normaliser, small chunks
    ("gspo", {}, 1, 2, G),  # sequence-level ratio, seq-mean-token-mean
    ("cispo", {"nll_coef": 0.1}, 2, 1, 2 * G),  # with VAPO's NLL term on nll_weight; one chunk per mini-batch
    # batch-level entropy statistics (high-entropy quantile, EDGE-GRPO's normaliser), an entropy bonus,
    # a sequence-level off-policy mask on behaviour_logp
    ("edge_grpo", {"high_entropy_quantile": 0.5, "entropy_coef": 0.01, "off_policy_correction": "seq_mask",
                   "off_policy_cap": 1.5}, 1, 2, G),
    # the clipped tokens' share of the output layer's gradient norms (a diagnostic: one more pass)
    ("dapo", {"clip_grad_share": True, "eps_low": 0.05, "eps_high": 0.05}, 1, 2, G),
]


@pytest.mark.parametrize("name,overrides,n,m,rows", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_packed_update_equals_unpacked(name, overrides, n, m, rows):
    objective = load_objective(name, **overrides)
    batch = _fields(objective, make_batch())
    params, tx, unpacked, packed = _steps(objective, n, m, rows)
    state_u, met_u = unpacked(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
    state_p, met_p = packed(init_train_state(params, tx), batch)
    assert sorted(met_u) == sorted(met_p)
    for k in met_u:
        np.testing.assert_allclose(np.asarray(met_p[k]), np.asarray(met_u[k]), rtol=2e-5, atol=1e-6, err_msg=k)
    assert float(met_u["update_applied"]) == 1.0 and float(met_u["loss"]) != 0.0
    for a, b in zip(jax.tree.leaves(state_u.params), jax.tree.leaves(state_p.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
    assert int(state_p.step) == int(state_u.step) == n
    if rows == G:  # the small chunks really split each mini-batch
        assert packed.packing_stats(batch)["chunks"] > n
    if objective.clip_grad_share:  # the batch's old log-probs are noise: both clips bind somewhere
        assert 0 < float(met_u["clip_grad_share_high"]) < 1 and 0 < float(met_u["clip_grad_share_low"]) < 1
    else:
        assert "clip_grad_share_high" not in met_u


@pytest.fixture(scope="module")
def unpacked_dapo_update():
    """(new params, metrics) of the unpacked DAPO update (2 mini-batches) on `make_batch(0)`, as NumPy: the
    reference every tail case below is compared to, computed once instead of once a case (it is the same
    program on the same inputs each time)."""
    objective = load_objective("dapo")
    batch = _fields(objective, make_batch(0))
    params, tx, unpacked, _ = _steps(objective, 2, 1, G)
    state_u, met_u = unpacked(init_train_state(params, tx), batch)
    return jax.tree.map(np.asarray, state_u.params), {k: np.asarray(v) for k, v in met_u.items()}


@pytest.mark.parametrize("share", [True, False], ids=["shared-prompts", "own-prompts"])
@pytest.mark.parametrize("tail", [0, 1, 2])
def test_tail_chunks_change_no_result(tail, share, unpacked_dapo_update):
    """The same packed update with no tail, tails of multiples of 1 row and of 2 rows (chunks of 3), with
    and without shared prompts: equal metrics and parameters, and all equal the unpacked update."""
    objective = load_objective("dapo")
    batch = _fields(objective, make_batch(0))  # 3 chunks of 3 rows without a tail; 1 or 2 tails with one
    params, tx, _, _ = _steps(objective, 2, 1, G)
    graphdef = nnx.graphdef(tiny_model())
    packed = PackedUpdate(graphdef, tx, optax.constant_schedule(0.1), objective=objective,
                          num_minibatches=2, chunk_rows=G, tail_rows=tail, share_prompts=share)
    stats = packed.packing_stats(batch)
    assert (stats["tail_chunks"] > 0) == (tail > 0), stats
    new_params_u, met_u = unpacked_dapo_update
    state_p, met_p = packed(init_train_state(params, tx), batch)
    assert sorted(met_p) == sorted(met_u)
    for k in met_u:
        np.testing.assert_allclose(np.asarray(met_p[k]), np.asarray(met_u[k]), rtol=2e-5, atol=1e-6, err_msg=k)
    for a, b in zip(jax.tree.leaves(new_params_u), jax.tree.leaves(state_p.params)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)


def test_lora_packed_update_equals_unpacked():
    """LoRA (the base frozen, merged in by the step's `frozen` argument): the packed update of the adapters
    equals the unpacked one, and both leave the base alone. B starts non-zero so both A and B move."""
    from dapo_jax.training.config.sections import LoRASection
    from dapo_jax.training.update.lora import PolicyWeights

    policy, adapters = PolicyWeights.build(tiny_model(), LoRASection(rank=2, alpha=4.0), seed=0)
    adapters = jax.tree.map(lambda x: x + 0.05 * jnp.cos(jnp.arange(x.size, dtype=x.dtype).reshape(x.shape)),
                            adapters)
    before = jax.tree.map(np.asarray, adapters)  # the packed step donates (overwrites) its input
    objective = load_objective("dapo")
    batch = _fields(objective, make_batch(1))
    tx = optax.sgd(0.1)
    kw = dict(objective=objective, num_minibatches=2, micro_batches=1)
    unpacked = make_train_step(policy.graphdef, tx, optax.constant_schedule(0.1), **kw)
    packed = PackedUpdate(policy.graphdef, tx, optax.constant_schedule(0.1), chunk_rows=G, **kw)
    state_u, met_u = unpacked(init_train_state(jax.tree.map(jnp.copy, adapters), tx), batch, policy.frozen)
    state_p, met_p = packed(init_train_state(adapters, tx), batch, policy.frozen)
    for k in met_u:
        np.testing.assert_allclose(np.asarray(met_p[k]), np.asarray(met_u[k]), rtol=2e-5, atol=1e-6, err_msg=k)
    moved = 0
    for a, b, old in zip(jax.tree.leaves(state_u.params), jax.tree.leaves(state_p.params), jax.tree.leaves(before)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-7)
        moved += int(not np.allclose(np.asarray(a), old))
    assert moved == len(jax.tree.leaves(before))  # every adapter matrix got a gradient
    assert float(met_u["update_applied"]) == 1.0


@pytest.mark.parametrize("rows,multiple,want", [(32, 1, 16), (3, 1, 2), (2, 1, 1), (1, 1, 0), (32, 3, 18),
                                                (8, 8, 0), (12, 4, 8), (8, 4, 4), (6, 4, 4), (4, 4, 0)])
def test_default_tail_rows(rows, multiple, want):
    assert default_tail_rows(rows, multiple) == want


@pytest.mark.parametrize("mb_rows,g,multiple,want", [
    (64, 8, 1, 32),  # half the micro-batch
    (64, 8, 3, 33),  # rounded up to the batch devices
    (64, 48, 1, 48),  # never fewer rows than a group
    (12, 10, 4, 12),  # G rounded up to the devices, within the micro-batch (which they divide)
    (6, 3, 1, 3),
    (130, 2, 1, 65),
    (9, 3, 1, 5),
])
def test_default_chunk_rows(mb_rows, g, multiple, want):
    assert default_chunk_rows(mb_rows, g, multiple) == want


def test_default_chunks_are_smaller_than_a_micro_batch():
    """With no chunk_rows a mini-batch of short responses (33 real tokens of 132 positions) takes one
    half-size chunk (6 rows), not one micro-batch-sized chunk (which would compute as much as unpacked),
    and with the default tail (half of it, 3 rows), a shorter one."""
    objective = load_objective("dapo")
    batch = _fields(objective, make_batch(4, max_len=1))
    *_, packed = _steps(objective, 1, 1, None)
    stats = packed.packing_stats(batch)
    assert stats["real_tokens"] == 33 and stats["unpacked_positions"] == P * G * (S + T) == 132, stats
    # 3 groups of 3 one-token responses after prompts of 3, 2 and 3 tokens: groups 0 and 3 take 2 + 3 x (1 + 1)
    # = 8 tokens in a row each; group 1's responses fill the 3 tokens left in rows 0 and 1 and a third row,
    # each after its own copy of the prompt's first token: 8 + 8 + 3 x 3 = 25 tokens, one 3-row tail of 11
    assert stats["packed_tokens"] == 25 and stats["chunks"] == stats["tail_chunks"] == 1, stats
    assert stats["packed_positions"] == 33, stats
    # each response after its own prompt: the 33 tokens fill the 3-row tail exactly; with tails in steps of
    # 2 rows they take a 4-row one
    alone = packing_stats(batch, 1, 1, share_prompts=False)
    assert alone["packed_tokens"] == 33 and alone["packed_positions"] == 33, alone
    assert packing_stats(batch, 1, 1, tail_rows=2, share_prompts=False)["packed_positions"] == 44
    no_tail = packing_stats(batch, 1, 1, tail_rows=0)
    assert no_tail["chunks"] == 1 and no_tail["tail_chunks"] == 0 and no_tail["packed_positions"] == 66, no_tail


@pytest.mark.parametrize("packed", [False, True], ids=["unpacked", "packed"])
@pytest.mark.parametrize("num_minibatches", [1, 2])
def test_uncommitted_params_compile_nothing_at_step_2(packed, num_minibatches):
    """Parameters from a plain `nnx.split` (no mesh) are uncommitted arrays; the step's outputs are
    committed. Both steps commit the state first, so step 2 compiles nothing (it compiled again before)."""
    graphdef, params = nnx.split(tiny_model())
    assert not jax.tree.leaves(params)[0].committed
    objective = load_objective("dapo")
    batch = _fields(objective, make_batch(0))
    tx = optax.adam(1e-3)
    make = PackedUpdate if packed else make_train_step
    step = make(graphdef, tx, optax.constant_schedule(1e-3), objective=objective, num_minibatches=num_minibatches)
    state = init_train_state(params, tx)
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    before = compile_count()
    for _ in range(2):
        state, metrics = step(state, batch)
        jax.block_until_ready(metrics)
    assert compile_count() == before
    assert float(metrics["update_applied"]) == 1.0


def test_segments_attend_only_within_themselves():
    """A row packing two sequences gives each the hidden states and log-probs it has alone."""
    graphdef, params = nnx.split(tiny_model(1))
    fwd = jax.jit(lambda ids, pos, segs: nnx.merge(graphdef, params)(ids, pos, jnp.ones_like(ids) if segs is None
                                                                      else (segs > 0).astype(jnp.int32),
                                                                      segment_ids=segs)[0])
    rng = np.random.default_rng(1)
    a, b = rng.integers(1, V, 5), rng.integers(1, V, 3)
    tokens = np.zeros((1, 10), np.int32)
    tokens[0, :5], tokens[0, 5:8] = a, b
    segs = np.array([[1] * 5 + [2] * 3 + [0] * 2], np.int32)
    pos = np.array([[0, 1, 2, 3, 4, 0, 1, 2, 0, 0]], np.int32)
    hidden = fwd(tokens, pos, segs)
    alone = {}
    for seq, sl in ((a, slice(0, 5)), (b, slice(5, 8))):
        alone[len(seq)] = fwd(seq[None].astype(np.int32), np.arange(len(seq))[None], None)
        np.testing.assert_allclose(np.asarray(hidden[0, sl]), np.asarray(alone[len(seq)][0]), rtol=1e-5, atol=1e-6)
    targets = np.zeros_like(tokens)
    targets[0, :4], targets[0, 5:7] = a[1:], b[1:]
    logp, _ = jax.jit(lambda *x: packed_logprobs(nnx.merge(graphdef, params), *x, temperature=1.0))(
        tokens, segs, pos, targets)
    w = np.asarray(nnx.merge(graphdef, params).output_embedding())
    for seq, start in ((a, 0), (b, 5)):  # log_softmax(h W)[next token], written out in NumPy
        z = np.asarray(alone[len(seq)][0]) @ w
        ref = z - np.log(np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)) - z.max(-1, keepdims=True)
        n = len(seq) - 1
        np.testing.assert_allclose(np.asarray(logp[0, start:start + n]), ref[np.arange(n), seq[1:]], rtol=1e-5,
                                   atol=1e-5)


def test_no_recompilation_when_lengths_change():
    objective = load_objective("dapo")
    params, tx, _, packed = _steps(objective, 2, 1, G)
    state = init_train_state(params, tx)
    compile_count()
    short, full = _fields(objective, make_batch(4, max_len=1)), _fields(objective, make_batch(6))
    empty = _fields(objective, make_batch(5)._replace(response_mask=jnp.asarray(np.zeros((P, G, T), np.float32))))
    assert packed.packing_stats(short)["chunks"] != packed.packing_stats(full)["chunks"]
    # the first step packs only tail chunks (1 and 2 rows), the second also full ones (3 rows): compiled at step 1
    assert packed.packing_stats(short)["tail_chunks"] == packed.packing_stats(short)["chunks"] == 2
    assert 0 < packed.packing_stats(full)["tail_chunks"] < packed.packing_stats(full)["chunks"]
    state, _ = packed(state, short)
    jax.block_until_ready(state)
    after_first = compile_count()
    state, metrics = packed(state, full)
    jax.block_until_ready(state)
    assert compile_count() == after_first
    state, m_empty = packed(state, empty)  # nothing to train on: no chunk at all, no update
    jax.block_until_ready(state)
    assert compile_count() == after_first
    assert float(metrics["update_applied"]) == 1.0 and float(m_empty["update_applied"]) == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("mesh", [[], ["mesh.data=2", "mesh.fsdp=2"]], ids=["one-device", "data2-fsdp2"])
def test_training_with_packing_runs_and_compiles_once(tmp_path, mesh):
    """The loop's packed update with the default chunk rows, also laid out over 4 batch devices
    (the chunk rows a multiple of data x fsdp)."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import train
    from dapo_jax.training.metrics import read_metrics

    cfg = load_config(ROOT / "dapo_jax" / "configs" / "tiny_dapo.yaml", [
        "optim.packing=true", "train.steps=3", "train.eval_every=0", "train.eval_k=1", "data.eval_size=4",
        "train.checkpoint_every=0", "train.progress=false", "train.tensorboard=false",
        f"train.run_dir={tmp_path / 'run'}", *mesh])
    train(cfg)
    steps = [r for r in read_metrics(tmp_path / "run") if "loss" in r]
    assert len(steps) == 3 and all(np.isfinite(r["loss"]) and r["update_tokens"] > 0 for r in steps)
    # as read back: the final evaluation's row merges into the last step's, and its count (which also
    # holds the end-of-run checkpoint's per-shard copies on a mesh) is `eval/compilations`
    counts = [r["compilations"] for r in steps]
    assert len(counts) == 3 and counts[2] == counts[1] == counts[0], counts


def test_packed_tied_entropies_keep_the_same_tokens_at_every_micro_batching_and_on_a_mesh():
    """The packed update's high-entropy mask under G-way ties at the threshold (tests/training/update/entropy_ties.py):
    the chunks compare the no-gradient pass's entropies, so every tied token is kept, and the kept fraction,
    the loss and the update equal the whole batch's float64 reference at micro_batches 1, 2, 4 and with
    the chunks laid out over 2 devices."""
    from jax.sharding import NamedSharding, PartitionSpec

    from dapo_jax.objectives.config import ObjectiveConfig
    from dapo_jax.parallel.host import to_global
    from dapo_jax.parallel.mesh import batch_sharding, make_mesh
    from tests.training.update import entropy_ties as ties

    model = ties.model()
    batch = ties.batch(model.config.vocab_size)
    ref = ties.reference(model, batch)
    objective = ObjectiveConfig(high_entropy_quantile=ref["q"], eps_low=ties.EPS_LOW, eps_high=ties.EPS_HIGH)
    graphdef, params = nnx.split(model)
    tx = optax.sgd(0.1)
    unpacked = make_train_step(graphdef, tx, optax.constant_schedule(0.1), objective=objective)
    expected, _ = unpacked(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
    mesh = make_mesh(1, 2, 1, devices=jax.devices()[:2])
    for micro, on_mesh in ((1, False), (2, False), (4, False), (2, True)):
        state = init_train_state(jax.tree.map(jnp.copy, params), tx)
        b, kw = batch, {}
        if on_mesh:
            state = jax.device_put(state, NamedSharding(mesh, PartitionSpec()))
            b = jax.device_put(batch, batch_sharding(mesh))
            kw = {"put": lambda x: to_global(x, batch_sharding(mesh)), "row_multiple": 2}
        packed = PackedUpdate(graphdef, tx, optax.constant_schedule(0.1), objective=objective,
                              micro_batches=micro, chunk_rows=ties.G, **kw)
        with jax.set_mesh(mesh) if on_mesh else contextlib.nullcontext():
            state, metrics = packed(state, b)
        where = f"micro_batches={micro}{' on 2 devices' if on_mesh else ''}"
        np.testing.assert_allclose(float(metrics["high_entropy_kept"]), ref["kept_fraction"], rtol=1e-6, err_msg=where)
        np.testing.assert_allclose(float(metrics["loss"]), ref["loss"], rtol=1e-4, err_msg=where)
        for a, b_ in zip(jax.tree.leaves(state.params), jax.tree.leaves(expected.params)):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b_), rtol=1e-4, atol=1e-6, err_msg=where)
