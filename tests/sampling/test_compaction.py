"""Active-row compaction: the same rollout as the uncompacted sampler (tokens, log-probs, entropies),
log-probs equal to the trainer's, one compilation per bucket, and the stage rule on a mesh."""

import re
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.sampling import SamplingConfig, SamplingConfigError, make_generate, pad_to_bucket
from dapo_jax.sampling.compaction import (
    MAX_STAGES, gather_prompt_cache, live_first, live_per_group, put_rows, stage_sizes, take_rows,
)
from dapo_jax.models.decode import PromptCache

T = 12
# ids 3..13 end a response: with this model some rows stop at their first token, most within a few,
# a few run to T (checked below, so the test cannot pass without compaction engaging)
EOS = tuple(range(3, 14))
PROMPTS = [[5, 9, 2], [7, 1, 1, 4, 8, 3, 6], [11, 12, 13, 14, 15], [20, 21], [30, 31, 32], [40]]


def tiny_decoder():
    cfg = ModelConfig(
        model_type="qwen2", vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, attention_bias=True,
    )
    model = Decoder(cfg, rngs=nnx.Rngs(0))
    model.lm_head.kernel[...] = model.lm_head.kernel[...] * 40  # peaked enough for top-k/top-p to bite
    return model


def tiny_decoder_on_two_devices():
    """(mesh, graphdef, state): `tiny_decoder` sharded over a data=2 mesh of the fake CPU devices."""
    from dapo_jax.models.sharding import shard_model
    from dapo_jax.parallel.mesh import make_mesh

    mesh = make_mesh(data=2, fsdp=1, tensor=1, devices=jax.devices()[:2])
    with jax.set_mesh(mesh):
        model = tiny_decoder()
        shard_model(model, mesh)
        return (mesh, *nnx.split(model))


def inputs(prompts=PROMPTS):
    ids, mask = pad_to_bucket(prompts, (8,), pad_id=0)
    return jnp.asarray(ids), jnp.asarray(mask)


def config(compaction, **kw):
    return SamplingConfig(max_new_tokens=T, eos_token_ids=EOS, pad_token_id=63, compaction=compaction,
                          compaction_min_rows=6, **kw)


def n_while_loops(gen, *args) -> int:
    return gen.lower(*args).as_text().count("stablehlo.while")


def assert_same_rollout(a, b):
    for name in ("response_ids", "response_mask", "lengths", "truncated", "prompt_ids"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    for name in ("logprobs", "sampled_logprobs", "entropy"):
        np.testing.assert_allclose(getattr(a, name), getattr(b, name), atol=2e-5, err_msg=name)
        # padding stays exactly 0
        assert (np.asarray(getattr(b, name))[np.asarray(b.response_mask) == 0] == 0).all(), name


def test_stage_sizes():
    assert stage_sizes(64, enabled=True, min_rows=8) == [64, 32, 16, 8]
    assert stage_sizes(64, enabled=False, min_rows=8) == [64]
    assert stage_sizes(1024, enabled=True, min_rows=1) == [1024 >> i for i in range(MAX_STAGES)]
    assert stage_sizes(24, enabled=True, min_rows=1, ways=4) == [24, 12]  # 6 rows do not split 4 ways
    assert stage_sizes(48, enabled=True, min_rows=7) == [48, 24, 12]
    for rows, ways in ((7, 1), (12, 4), (8, 1)):  # odd / halves not a multiple of the devices / under the floor
        with pytest.warns(UserWarning, match="rollout.compaction"):
            assert stage_sizes(rows, enabled=True, min_rows=5, ways=ways) == [rows]
    with pytest.raises(SamplingConfigError, match="compaction_min_rows"):
        SamplingConfig(max_new_tokens=4, compaction_min_rows=0)
    with pytest.raises(SamplingConfigError, match="compaction must"):
        SamplingConfig(max_new_tokens=4, compaction=1)


SAMPLING = dict(temperature=0.7, top_k=12, top_p=0.9)


@pytest.fixture(scope="module", params=[None, 2], ids=["one block", "blocks of 2+ slots"])
def ragged(request):
    """The uncompacted and the compacted sampler on the same 6 prompts x G = 4 (stages 24, 12, 6); with the
    response slots in one block (the default at this length), and in several, as long rollouts fill them
    (compaction then merges the first stage's blocks)."""
    import dapo_jax.sampling.sampler as sampler

    with pytest.MonkeyPatch.context() as patch:  # read whenever a sampler is traced: kept for the module's tests
        if request.param is not None:
            patch.setattr(sampler, "_MIN_BLOCK_SLOTS", request.param)
        model = tiny_decoder()
        graphdef, state = nnx.split(model)
        ids, mask = inputs()
        key = jax.random.key(3)
        plain = make_generate(graphdef, config(False, **SAMPLING), 4, with_steps=True)
        packed = make_generate(graphdef, config(True, **SAMPLING), 4, with_steps=True)
        yield dict(model=model, state=state, ids=ids, mask=mask, key=key, plain=plain, packed=packed,
                   ref=plain(state, ids, mask, key), out=packed(state, ids, mask, key),
                   blocks=len(sampler._block_sizes(T - 1)), one_block=request.param is None)


def test_compacted_rollout_equals_the_uncompacted_one(ragged):
    (ref, ref_steps), (out, steps) = ragged["ref"], ragged["out"]
    assert_same_rollout(ref, out)
    assert int(steps) == int(ref_steps) == T - 1
    # the case compaction is for: ragged lengths, from an EOS at the first token to truncation at T,
    # with fewer than half the rows left well before T (else nothing would be compacted)
    lengths = np.asarray(out.lengths).ravel()
    assert lengths.min() == 1 and np.asarray(out.truncated).sum() >= 3, lengths
    live = lambda t: int((lengths > t).sum())  # rows still decoding after token t
    assert live(T // 2) <= 12 and live(T - 2) <= 6, lengths
    # one decode loop per block at the first stage, then one more per later stage (2)
    args = (ragged["state"], ragged["ids"], ragged["mask"], ragged["key"])
    assert n_while_loops(ragged["packed"], *args) == n_while_loops(ragged["plain"], *args) + 2


def test_the_blocks_are_the_fixtures(ragged, monkeypatch):
    """The two samplers really decode in 1 and in several blocks: a decode loop per block."""
    import dapo_jax.sampling.sampler as sampler

    args = (ragged["state"], ragged["ids"], ragged["mask"], ragged["key"])
    n = n_while_loops(ragged["plain"], *args)
    monkeypatch.setattr(sampler, "_MIN_BLOCK_SLOTS", 10 ** 6)  # one block
    one = n_while_loops(make_generate(nnx.split(ragged["model"])[0], config(False, **SAMPLING), 4), *args)
    assert n == one + ragged["blocks"] - 1
    assert ragged["blocks"] == (1 if ragged["one_block"] else 4)  # 11 fed slots: one block, or 3+3+3+2


def test_compacted_logprobs_are_the_trainers(ragged):
    from dapo_jax.models.logprobs import response_logprobs

    out, _ = ragged["out"]
    logp, entropy = response_logprobs(ragged["model"], out.prompt_ids, out.prompt_mask, out.response_ids,
                                      out.response_mask, temperature=SAMPLING["temperature"])
    m = np.asarray(out.response_mask).astype(bool)
    assert np.abs(np.asarray(logp) - np.asarray(out.logprobs)).max() <= 1e-5
    assert np.abs(np.where(m, np.asarray(entropy) - np.asarray(out.entropy), 0)).max() <= 1e-4


def test_another_length_pattern_does_not_recompile(ragged):
    state, packed, plain = ragged["state"], ragged["packed"], ragged["plain"]
    ids, mask = inputs([[1, 2], [3], [4, 5, 6, 7, 8], [9, 10], [11], [12, 13]])
    out, _ = packed(state, ids, mask, jax.random.key(4))
    assert (np.asarray(out.lengths) != np.asarray(ragged["out"][0].lengths)).any()
    assert_same_rollout(plain(state, ids, mask, jax.random.key(4))[0], out)
    assert packed._cache_size() == 1 and plain._cache_size() == 1


@pytest.mark.skipif(jax.device_count() < 2, reason="needs the fake CPU devices from tests/conftest.py")
def test_compaction_on_a_mesh_keeps_stages_divisible_by_the_batch_devices(ragged):
    mesh, graphdef, state = tiny_decoder_on_two_devices()
    with jax.set_mesh(mesh):
        ids, mask = (jax.device_put(x, jax.NamedSharding(mesh, jax.P(("data", "fsdp"))))
                     for x in (ragged["ids"], ragged["mask"]))
        packed = make_generate(graphdef, config(True, **SAMPLING), 4)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # 24 -> 12 -> 6 rows split over the 2 devices: no warning
            out = packed(state, ids, mask, ragged["key"])
        # stages 24, 12, 6 (3 rows would not split over 2 devices)
        assert n_while_loops(packed, state, ids, mask, ragged["key"]) == n_while_loops(
            ragged["plain"], ragged["state"], ragged["ids"], ragged["mask"], ragged["key"]) + 2
        # no row moves to the other device: a gather over the whole batch would all-gather every
        # row's caches onto both devices (and top-k every row's logits, every step)
        compiled = packed.lower(state, ids, mask, ragged["key"]).compile().as_text()
        assert not re.findall(r" (all-gather|all-to-all|collective-permute)\(", compiled)
    assert {s.data.shape[0] for s in out.response_ids.addressable_shards} == {3}  # [P=6, G, T] over 2 devices
    assert_same_rollout(ragged["ref"][0], out)


def test_greedy_chain_with_known_lengths():
    """A scripted model (`(last + 1) mod 32`, EOS 20 and 25): every row's response is known."""
    from tests.sampling.test_sampler import chain_decoder

    prompts = [[19], [24], [1, 2], [15], [26], [23], [10], [13]]  # stages 8, 4, 2
    ids, mask = pad_to_bucket(prompts, (4,), pad_id=0)
    graphdef, state = nnx.split(chain_decoder())
    config = SamplingConfig(max_new_tokens=8, greedy=True, eos_token_ids=(20, 25), pad_token_id=0,
                            compaction=True, compaction_min_rows=2)
    out = make_generate(graphdef, config, 1)(state, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0))
    want = np.zeros((8, 8), np.int32)
    for i, p in enumerate(prompts):
        for t in range(8):
            want[i, t] = (p[-1] + 1 + t) % 32
            if want[i, t] in (20, 25):
                break
    np.testing.assert_array_equal(np.asarray(out.response_ids)[:, 0], want)
    np.testing.assert_array_equal(np.asarray(out.lengths)[:, 0], [1, 1, 8, 5, 8, 2, 8, 7])
    np.testing.assert_array_equal(np.asarray(out.truncated)[:, 0], [False, False, True, False, True, False, True, False])
    assert (np.asarray(out.logprobs)[np.asarray(out.response_mask) == 0] == 0).all()


def test_each_group_compacts_within_itself():
    """Against NumPy: the kept rows per group (live first, in row order), the gathers and the write-back."""
    done = np.array([1, 0, 1, 0, 0, 1, 1, 1, 0, 1, 1, 1], bool)  # 3 groups of 4: live 2, 1, 1
    local = np.asarray(live_first(jnp.asarray(done), 6, ways=3))
    np.testing.assert_array_equal(local, [[1, 3], [0, 1], [0, 1]])  # group 1: its live row 4, then row 5
    assert int(live_per_group(jnp.asarray(done), 3)) == 2 and int(live_per_group(jnp.asarray(done))) == 4
    np.testing.assert_array_equal(live_first(jnp.asarray(done), 4), [[1, 3, 4, 8]])  # one group: global
    x = np.arange(12 * 3).reshape(12, 3)
    rows = np.array([1, 3, 4, 5, 8, 9])  # the global rows `local` names
    np.testing.assert_array_equal(take_rows(jnp.asarray(x), jnp.asarray(local)), x[rows])
    out = np.zeros_like(x)
    want = out.copy()
    want[rows] = x[rows] + 100
    np.testing.assert_array_equal(put_rows(jnp.asarray(out), jnp.asarray(local), jnp.asarray(x[rows] + 100)), want)


@pytest.mark.parametrize("ways", [1, 2, 3])
def test_prompt_cache_gather_by_group(ways):
    """Entry i is prompt `index[i]`, whether the prompts split over the groups (a gather within each) or not."""
    prompts, g = 6, 2
    cache = PromptCache(k=(jnp.arange(prompts * 5.0).reshape(prompts, 5),), v=(-jnp.arange(prompts * 5.0).reshape(prompts, 5),),
                        lengths=jnp.arange(prompts, dtype=jnp.int32) + 1)
    # the rows a stage keeps, each group's in its own slice: any order with one group, 3 of 6 rows per
    # group with two, 2 of 4 with three
    rows = {1: np.array([11, 0, 3, 6, 2, 8]), 2: np.array([0, 1, 5, 7, 9, 11]), 3: np.array([0, 3, 5, 6, 8, 11])}[ways]
    got = gather_prompt_cache(cache, jnp.asarray(rows // g), ways)
    np.testing.assert_array_equal(got.k[0], np.asarray(cache.k[0])[rows // g])
    np.testing.assert_array_equal(got.v[0], np.asarray(cache.v[0])[rows // g])
    np.testing.assert_array_equal(got.lengths, rows // g + 1)
    odd = PromptCache(k=(cache.k[0][:5],), v=(cache.v[0][:5],), lengths=cache.lengths[:5])  # 5 prompts, 2 ways
    np.testing.assert_array_equal(gather_prompt_cache(odd, jnp.asarray([4, 0]), 2).lengths, [5, 1])
