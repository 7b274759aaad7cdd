"""The KV-cache rollout: EOS handling and early exit, log-probs and entropies equal to the training
forward, determinism, and one compilation per prompt bucket."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder, positions_from_mask
from dapo_jax.sampling import Rollout, SamplingConfig, generate, make_generate, pad_to_bucket


# --------------------------------------------------------------------------- a scripted model
def chain_decoder(vocab: int = 32, margin: float = 50.0) -> Decoder:
    """A real Decoder that emits `(last token + 1) mod V` with a logit margin of 50.

    Every layer weight is 0, so each block is the identity; the embedding is one-hot (d = V), the
    final RMSNorm scales it by sqrt(V), and lm_head is the cyclic shift scaled back by 1/sqrt(V).
    """
    cfg = ModelConfig(
        model_type="qwen2", vocab_size=vocab, hidden_size=vocab, intermediate_size=4, num_hidden_layers=1,
        num_attention_heads=1, num_key_value_heads=1, head_dim=2, attention_bias=False,
    )
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    for path, param in nnx.iter_graph(model):
        if isinstance(param, nnx.Param) and "layers" in path and "layernorm" not in "/".join(map(str, path)):
            param[...] = jnp.zeros_like(param[...])
    model.embed_tokens.embedding[...] = jnp.eye(vocab)
    model.lm_head.kernel[...] = jnp.roll(jnp.eye(vocab), 1, axis=1) * margin / np.sqrt(vocab)
    return model


EOS = (20, 25)


def chain_rollout(prompts, *, max_new_tokens=8, num_samples=2, temperature=1.0):
    ids, mask = pad_to_bucket(prompts, (4,), pad_id=0)
    config = SamplingConfig(max_new_tokens=max_new_tokens, temperature=temperature, eos_token_ids=EOS, pad_token_id=0)
    graphdef, state = nnx.split(chain_decoder())
    gen = make_generate(graphdef, config, num_samples, with_steps=True)
    return gen(state, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0))


def test_eos_masking_lengths_truncation_and_several_eos_ids():
    # 15 -> 16..20 (EOS 20 at index 4); 22 -> 23, 24, 25 (EOS 25); 26 -> 27..31, 0, 1, 2 (no EOS in 8)
    rollout, steps = chain_rollout([[1, 2, 15], [3, 22], [5, 6, 7, 26]])
    assert isinstance(rollout, Rollout)
    # a margin of 50 nats: the sampling distribution is a point mass, entropy ~0 (and 0 on padding)
    np.testing.assert_allclose(rollout.entropy, 0.0, atol=1e-6)
    expect_ids = np.array([
        [16, 17, 18, 19, 20, 0, 0, 0],
        [23, 24, 25, 0, 0, 0, 0, 0],
        [27, 28, 29, 30, 31, 0, 1, 2],  # the real tokens 0 here are not padding: the mask says so
    ])
    expect_mask = np.array([[1] * 5 + [0] * 3, [1] * 3 + [0] * 5, [1] * 8])
    for g in range(2):
        np.testing.assert_array_equal(rollout.response_ids[:, g], expect_ids)
        np.testing.assert_array_equal(rollout.response_mask[:, g], expect_mask)
    np.testing.assert_array_equal(rollout.lengths, [[5, 5], [3, 3], [8, 8]])
    np.testing.assert_array_equal(rollout.truncated, [[False, False], [False, False], [True, True]])
    assert rollout.response_ids.shape == rollout.logprobs.shape == (3, 2, 8)
    assert rollout.response_ids.dtype == jnp.int32 and rollout.logprobs.dtype == jnp.float32
    # padding carries log-prob exactly 0; real tokens have probability ~1 under the chain
    assert (np.asarray(rollout.logprobs)[expect_mask[:, None].repeat(2, 1) == 0] == 0).all()
    np.testing.assert_allclose(rollout.logprobs, 0.0, atol=1e-6)
    assert int(steps) == 7  # T - 1 forwards: the third row never stops


def test_loop_exits_early_once_every_row_has_finished():
    # rows finish after 5 and 3 tokens: token 0 comes from the prefill, tokens 1..4 need 4 forwards
    rollout, steps = chain_rollout([[1, 2, 15], [3, 22]], max_new_tokens=16)
    assert int(steps) == 4
    np.testing.assert_array_equal(rollout.lengths, [[5, 5], [3, 3]])
    assert not np.asarray(rollout.truncated).any()
    assert (np.asarray(rollout.response_ids)[:, :, 5:] == 0).all()
    # an EOS as the very first token: zero decode forwards
    rollout, steps = chain_rollout([[4, 19], [3, 24]], max_new_tokens=16)
    assert int(steps) == 0
    np.testing.assert_array_equal(rollout.lengths, [[1, 1], [1, 1]])
    np.testing.assert_array_equal(rollout.response_ids[:, :, 0], [[20, 20], [25, 25]])


@pytest.mark.parametrize("greedy", [False, True])
def test_entropy_of_a_uniform_policy_is_log_vocab(greedy):
    # margin 0: every logit is 0, so the sampling distribution is uniform over V = 32 at any temperature
    ids, mask = pad_to_bucket([[1, 2, 15], [3]], (4,), pad_id=0)
    config = SamplingConfig(max_new_tokens=5, temperature=0.0 if greedy else 0.5, pad_token_id=0)
    graphdef, state = nnx.split(chain_decoder(margin=0.0))
    rollout = make_generate(graphdef, config, 3)(state, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0))
    np.testing.assert_allclose(rollout.entropy, np.log(32), rtol=1e-5)


# --------------------------------------------------------------------------- a real (tiny) decoder
def tiny_decoder(dtype="float32", seed=0):
    cfg = ModelConfig(
        model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True,
        param_dtype=dtype, dtype=dtype,
    )
    model = Decoder(cfg, rngs=nnx.Rngs(seed))
    # widen the logits (the 0.02 init gives a near-uniform policy) so top-k/top-p bite
    model.lm_head.kernel[...] = model.lm_head.kernel[...] * 40
    return model


PROMPTS = [[5, 9, 2], [7, 1, 1, 4, 8, 3, 6], [11, 12, 13, 14, 15]]


def direct_logprobs(model, rollout, temperature):
    """Reference: one full forward over concat(prompt, response), logits at S-1+t, fp32 log-softmax."""
    p, g, t = rollout.response_ids.shape
    s = rollout.prompt_ids.shape[1]
    ids = jnp.concatenate([jnp.repeat(rollout.prompt_ids, g, 0), rollout.response_ids.reshape(p * g, t)], 1)
    mask = jnp.concatenate([jnp.repeat(rollout.prompt_mask, g, 0), rollout.response_mask.reshape(p * g, t)], 1)
    hidden, _ = model(ids, positions_from_mask(mask), mask)
    logits = np.asarray(model.logits(hidden[:, s - 1 : s + t - 1]), np.float64) / temperature
    logp_all = logits - logits.max(-1, keepdims=True)
    logp_all = logp_all - np.log(np.exp(logp_all).sum(-1, keepdims=True))
    return logp_all.reshape(p, g, t, -1)


@pytest.mark.parametrize("blocks", [1, 3])  # 3: the response slots in blocks of 3, as long rollouts fill them
@pytest.mark.parametrize("temperature, top_k, top_p", [(1.0, 0, 1.0), (0.7, 12, 0.9)])
def test_logprobs_equal_the_training_forward(temperature, top_k, top_p, blocks, monkeypatch):
    import dapo_jax.sampling.sampler as sampler

    if blocks > 1:  # 9 fed slots in 3 blocks (the default rule gives short rollouts one)
        monkeypatch.setattr(sampler, "_MIN_BLOCK_SLOTS", 3)
    model = tiny_decoder()
    ids, mask = pad_to_bucket(PROMPTS, (8,), pad_id=0)
    config = SamplingConfig(max_new_tokens=10, temperature=temperature, top_k=top_k, top_p=top_p,
                            eos_token_ids=(3, 4), pad_token_id=63)
    graphdef, state = nnx.split(model)
    gen = make_generate(graphdef, config, 3)  # its own jit: traced under this block rule
    args = (state, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(1))
    assert len(sampler._block_sizes(9)) == blocks
    if blocks > 1:  # one decode loop per block: blocks - 1 more than in one block
        from tests.sampling.test_compaction import n_while_loops

        n = n_while_loops(gen, *args)
        monkeypatch.setattr(sampler, "_MIN_BLOCK_SLOTS", 10 ** 6)
        assert n == n_while_loops(make_generate(graphdef, config, 3), *args) + blocks - 1
    rollout = gen(*args)
    ref = direct_logprobs(model, rollout, temperature)  # [P, G, T, V]
    tok = np.asarray(rollout.response_ids)
    m = np.asarray(rollout.response_mask).astype(bool)
    want = np.take_along_axis(ref, tok[..., None], -1)[..., 0]
    got = np.asarray(rollout.logprobs)
    assert np.abs(np.where(m, got - want, 0)).max() <= 1e-5
    assert (got[~m] == 0).all() and (np.asarray(rollout.sampled_logprobs)[~m] == 0).all()
    assert (tok[~m] == 63).all()

    # sampled_logprobs: the renormalised truncated distribution, rebuilt with an explicit sort
    q = np.full(ref.shape, -np.inf)
    flat_ref, flat_q = ref.reshape(-1, ref.shape[-1]), q.reshape(-1, ref.shape[-1])
    for i, row in enumerate(flat_ref):
        order = np.argsort(-row)[: top_k or None]
        probs = np.exp(row[order] - np.logaddexp.reduce(row[order]))
        n_keep = max(1, int(np.sum(np.cumsum(probs) - probs < top_p)))
        kept = order[:n_keep]
        flat_q[i, kept] = row[kept] - np.logaddexp.reduce(row[kept])
    want_q = np.take_along_axis(q, tok[..., None], -1)[..., 0]
    assert np.isfinite(want_q[m]).all(), "sampled a token outside the top-k/top-p set"
    assert np.abs(np.where(m, np.asarray(rollout.sampled_logprobs) - want_q, 0)).max() <= 1e-5
    if top_k == 0 and top_p == 1.0:
        np.testing.assert_array_equal(rollout.logprobs, rollout.sampled_logprobs)

    # entropy: of the tempered FULL distribution (before top-k/top-p), 0 on padding
    want_h = -np.sum(np.exp(ref) * ref, axis=-1)
    got_h = np.asarray(rollout.entropy)
    assert got_h.shape == got.shape and got_h.dtype == np.float32
    assert np.abs(np.where(m, got_h - want_h, 0)).max() <= 1e-4
    assert (got_h[~m] == 0).all() and (got_h[m] > 0).all()

    # the trainer's own log-prob function agrees too (its entropy is the train step's `entropy` metric)
    from dapo_jax.models.logprobs import response_logprobs

    trainer_logp, trainer_h = response_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                                                rollout.response_mask, temperature=temperature)
    assert np.abs(np.asarray(trainer_logp) - got).max() <= 1e-5
    assert np.abs(np.where(m, np.asarray(trainer_h) - got_h, 0)).max() <= 1e-4

    # EOS bookkeeping on real samples: a response ends at its first EOS, or is truncated at T
    for row_t, row_m, length, trunc in zip(tok.reshape(-1, 10), m.reshape(-1, 10),
                                           np.asarray(rollout.lengths).ravel(), np.asarray(rollout.truncated).ravel()):
        eos_at = [i for i, x in enumerate(row_t[:length]) if x in (3, 4)]
        assert row_m.sum() == length and row_m[:length].all()
        assert (eos_at == [length - 1]) if not trunc else (eos_at == [] and length == 10)


def test_bf16_logprobs_close_to_the_training_forward():
    model = tiny_decoder("bfloat16")
    ids, mask = pad_to_bucket(PROMPTS, (8,), pad_id=0)
    config = SamplingConfig(max_new_tokens=6, temperature=0.8, eos_token_ids=(), pad_token_id=0)
    rollout = generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(2), num_samples=2, config=config)
    assert rollout.logprobs.dtype == jnp.float32
    from dapo_jax.models.logprobs import response_logprobs

    ref, _ = response_logprobs(model, rollout.prompt_ids, rollout.prompt_mask, rollout.response_ids,
                               rollout.response_mask, temperature=0.8)
    # bf16 activations: the cached one-token path and the full pass round differently (stated 0.1 nats)
    assert np.abs(np.asarray(ref) - np.asarray(rollout.logprobs)).max() < 0.1


def test_same_key_identical_new_key_different_and_one_compilation_per_bucket():
    model = tiny_decoder()
    graphdef, state = nnx.split(model)
    config = SamplingConfig(max_new_tokens=8, temperature=1.0, eos_token_ids=(), pad_token_id=0)
    gen = make_generate(graphdef, config, 4)
    ids, mask = (jnp.asarray(x) for x in pad_to_bucket(PROMPTS, (8,), pad_id=0))
    a = gen(state, ids, mask, jax.random.key(7))
    b = gen(state, ids, mask, jax.random.key(7))
    jax.tree.map(np.testing.assert_array_equal, a, b)
    c = gen(state, ids, mask, jax.random.key(8))
    assert (np.asarray(a.response_ids) != np.asarray(c.response_ids)).any()
    # the G samples of one prompt differ from each other (independent draws, not copies)
    assert (np.asarray(a.response_ids)[:, 0] != np.asarray(a.response_ids)[:, 1]).any()
    ids2, mask2 = (jnp.asarray(x) for x in pad_to_bucket([[1, 2], [3], [4, 5, 6, 7, 8]], (8,), pad_id=0))
    gen(state, ids2, mask2, jax.random.key(9))
    assert gen._cache_size() == 1, "a new prompt batch of the same bucket (or a new key) recompiled"
    ids3, mask3 = (jnp.asarray(x) for x in pad_to_bucket(PROMPTS, (16,), pad_id=0))
    gen(state, ids3, mask3, jax.random.key(9))
    assert gen._cache_size() == 2


def test_left_padding_does_not_change_the_responses():
    """The same prompt in a wider bucket (more left padding) gives the same greedy tokens and log-probs."""
    model = tiny_decoder()
    config = SamplingConfig(max_new_tokens=6, greedy=True, eos_token_ids=(), pad_token_id=0)
    outs = []
    for bucket in (8, 12):
        ids, mask = pad_to_bucket(PROMPTS, (bucket,), pad_id=0)
        outs.append(generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), num_samples=1,
                             config=config))
    np.testing.assert_array_equal(outs[0].response_ids, outs[1].response_ids)
    np.testing.assert_allclose(outs[0].logprobs, outs[1].logprobs, atol=1e-5)


def test_bad_prompt_shapes_are_named():
    model = tiny_decoder()
    config = SamplingConfig(max_new_tokens=2)
    with pytest.raises(ValueError, match="prompt_mask"):
        generate(model, jnp.zeros((2, 4), jnp.int32), jnp.ones((2, 5), jnp.int32), jax.random.key(0),
                 num_samples=1, config=config)
    with pytest.raises(ValueError, match="num_samples"):
        make_generate(nnx.split(model)[0], config, 0)


def test_response_blocks_cover_every_fed_slot_once():
    from dapo_jax.sampling.sampler import _MAX_BLOCKS, _MIN_BLOCK_SLOTS, _block_sizes

    assert _block_sizes(0) == []
    for n in (1, 2, 3, 7, 31, 32, 63, 64, 97, 127, 143, 1000):
        sizes = _block_sizes(n)
        assert sum(sizes) == n and 1 <= len(sizes) <= _MAX_BLOCKS and min(sizes) >= 1
        assert len(sizes) == max(1, min(_MAX_BLOCKS, n // _MIN_BLOCK_SLOTS))  # a block per 32 slots, at most 4
        assert max(sizes) - min(sizes) <= len(sizes)  # near-equal
    # the shipped lengths: 6 and 64 new tokens decode in one block, the main job's 144 in four
    assert _block_sizes(5) == [5] and _block_sizes(63) == [63] and len(_block_sizes(143)) == 4
