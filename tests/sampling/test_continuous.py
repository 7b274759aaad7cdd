"""Continuous batching: every streamed group is the group `generate` draws for that prompt alone
with the key `fold_in(key, serial)` (tokens identical, log-probs to float rounding), log-probs are the
trainer's, slots are refilled as groups finish, closing the stream drops the rest, one compilation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.sampling import SamplingConfig, SamplingConfigError, make_generate, pad_to_bucket
from dapo_jax.sampling.continuous import ContinuousSampler, default_refill
from tests.sampling.test_compaction import EOS, assert_same_rollout, tiny_decoder, tiny_decoder_on_two_devices

T, G, WIDTH = 12, 4, 8
# 10 prompts of different lengths; the sampler holds 4 at once and refills 2 at a time
PROMPTS = [[5, 9, 2], [7, 1, 1, 4, 8, 3, 6], [11, 12, 13, 14, 15], [20, 21], [30, 31, 32], [40],
           [41, 42], [43, 44, 45, 46], [47], [48, 49, 50, 51, 52, 53, 54, 55]]
SAMPLING = dict(temperature=0.7, top_k=12, top_p=0.9)


def config(**kw):
    return SamplingConfig(max_new_tokens=T, eos_token_ids=EOS, pad_token_id=63, **kw)


class Source:
    """`next_prompts` over PROMPTS in order, cycled (payload: the serial); records each request."""

    def __init__(self, prompts=PROMPTS):
        self.prompts, self.next, self.requests = prompts, 0, []

    def __call__(self, n):
        chunk = [self.prompts[i % len(self.prompts)] for i in range(self.next, self.next + n)]
        ids, mask = pad_to_bucket(chunk, (max(map(len, chunk)),), pad_id=63)  # as narrow as the longest
        payloads = list(range(self.next, self.next + n))
        self.next += n
        self.requests.append(n)
        return ids, mask, payloads


@pytest.fixture(scope="module", autouse=True)
def optimised_compiles():
    """This module compares the continuous sampler's tokens with the serial sampler's exactly: two different
    programs, so it compiles them as a user's run does (tests/conftest.py leaves out LLVM's optimisation, and
    without it the two programs' float rounding once drew a different token)."""
    previous = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", False)
    yield
    jax.config.update("jax_disable_most_optimizations", previous)


@pytest.fixture(scope="module")
def streamed(optimised_compiles):
    model = tiny_decoder()
    graphdef, state = nnx.split(model)
    sampler = ContinuousSampler(graphdef, config(**SAMPLING), num_samples=G, slots=4, refill=2, prompt_width=WIDTH)
    source, key = Source(), jax.random.key(7)
    completed, take = [], sampler._take  # records the serials in the order their rows complete

    def spy(st, rows, holder, sample, groups):
        completed.extend(int(holder[row]) for row in rows)
        return take(st, rows, holder, sample, groups)

    sampler._take = spy
    chunks = list(sampler.stream(state, source, key, max_prompts=len(PROMPTS)))
    sampler._take = take
    return dict(dropped=sampler.dropped_tokens, model=model, graphdef=graphdef, state=state, sampler=sampler,
                source=source, key=key, chunks=chunks,
                completed=completed)


def reference(streamed, prompt_index, serial, cfg=None):
    """`generate` on that one prompt, padded to WIDTH, with the key `fold_in(key, serial)`."""
    gen = make_generate(streamed["graphdef"], cfg or config(**SAMPLING), G)
    ids, mask = pad_to_bucket([PROMPTS[prompt_index]], (WIDTH,), pad_id=63)
    return gen(streamed["state"], jnp.asarray(ids), jnp.asarray(mask), jax.random.fold_in(streamed["key"], serial))


def test_every_group_is_generates_group_for_its_serial(streamed):
    seen = []
    for chunk in streamed["chunks"]:
        for j, (payload, serial) in enumerate(zip(chunk.payloads, chunk.serials)):
            assert payload == serial  # the source's order is the admission order
            one = jax.tree.map(lambda x: np.asarray(x)[j:j + 1], chunk.rollout)
            assert_same_rollout(reference(streamed, payload, int(serial)), one)
            seen.append(payload)
    # each prompt once, in the order they went in (whatever order they finished in: see below)
    assert seen == list(range(len(PROMPTS)))
    # ragged lengths: EOS at the first token up to truncation at T (so refills happen mid-decode)
    lengths = np.concatenate([np.asarray(c.rollout.lengths).ravel() for c in streamed["chunks"]])
    assert lengths.min() == 1 and lengths.max() == T, lengths


def test_slots_are_refilled_two_at_a_time(streamed):
    # 4 slots: two refills of 2 fill them, then refills of 2 as groups finish (10 = 2+2+2+2+2)
    assert streamed["source"].requests == [2, 2, 2, 2, 2]
    # handed out 2 at a time too: one shape for whatever the caller computes on a chunk
    assert [len(c.payloads) for c in streamed["chunks"]] == [2] * 5
    assert streamed["dropped"] == 0  # a stream run to its end drops nothing
    # rows of later prompts completed before rows of earlier ones (the case the in-order hand-out is for)
    completed = streamed["completed"]
    assert sorted(completed) == sorted(list(range(len(PROMPTS))) * G) and completed != sorted(completed), completed


def test_default_refill_divides_the_slots():
    assert [default_refill(n) for n in (1, 3, 4, 8, 14, 16, 18, 64)] == [1, 1, 1, 2, 2, 4, 3, 16]


def test_streamed_logprobs_are_the_trainers(streamed):
    from dapo_jax.models.logprobs import response_logprobs

    for chunk in streamed["chunks"]:
        out = chunk.rollout
        logp, entropy = response_logprobs(streamed["model"], jnp.asarray(out.prompt_ids), jnp.asarray(out.prompt_mask),
                                          jnp.asarray(out.response_ids), jnp.asarray(out.response_mask),
                                          temperature=SAMPLING["temperature"])
        m = np.asarray(out.response_mask).astype(bool)
        assert np.abs(np.asarray(logp) - out.logprobs).max() <= 1e-5
        assert np.abs(np.where(m, np.asarray(entropy) - out.entropy, 0)).max() <= 1e-4


def test_closing_the_stream_drops_the_rest_and_nothing_recompiles(streamed):
    sampler, source = streamed["sampler"], Source()
    stream = sampler.stream(streamed["state"], source, jax.random.key(8), max_prompts=100)  # PROMPTS, cycled
    first = next(stream)
    stream.close()
    assert first.payloads == [0, 1] and source.next < 20  # never asked for the rest
    # tokens drawn for the admitted groups it never handed out: some, at most all their slots
    assert 0 < sampler.dropped_tokens <= (source.next - 2) * G * T
    for fn in (sampler._empty, sampler._admit, sampler._decode):
        assert fn._cache_size() == 1  # a second stream, other lengths and a partial refill: no new shapes


@pytest.mark.parametrize("cap", [0, 3])
def test_capping_the_prompts_in_flight_changes_no_group(streamed, cap):
    """`in_flight` admits fewer prompts ahead (0: only the next chunk's), never stalls, and every
    group is still the one its serial draws."""
    sampler, source = streamed["sampler"], Source()
    asked = []

    def in_flight():
        asked.append(cap)
        return cap

    chunks = list(sampler.stream(streamed["state"], source, streamed["key"], max_prompts=len(PROMPTS),
                                 in_flight=in_flight))
    assert asked and [c.payloads for c in chunks] == [c.payloads for c in streamed["chunks"]]
    for ours, ref in zip(chunks, streamed["chunks"]):
        assert_same_rollout(ref.rollout, ours.rollout)
    if cap == 0:  # one chunk (2 prompts) at a time
        assert source.requests == [2] * 5


def test_a_budget_smaller_than_the_slots_and_greedy(streamed):
    sampler = ContinuousSampler(streamed["graphdef"], config(greedy=True), num_samples=G, slots=4, refill=4,
                                prompt_width=WIDTH)
    chunks = list(sampler.stream(streamed["state"], Source(), streamed["key"], max_prompts=3))
    got = {p: jax.tree.map(lambda x: np.asarray(x)[j:j + 1], c.rollout)
           for c in chunks for j, p in enumerate(c.payloads)}
    assert sorted(got) == [0, 1, 2]
    for p, one in got.items():
        assert_same_rollout(reference(streamed, p, p, config(greedy=True)), one)


def test_bad_settings_are_refused():
    graphdef = nnx.split(tiny_decoder())[0]
    with pytest.raises(SamplingConfigError, match="alternatives"):
        ContinuousSampler(graphdef, config(compaction=True), num_samples=G, slots=4, refill=2, prompt_width=WIDTH)
    with pytest.raises(SamplingConfigError, match="refill"):
        ContinuousSampler(graphdef, config(), num_samples=G, slots=4, refill=5, prompt_width=WIDTH)
    with pytest.raises(SamplingConfigError, match="max_new_tokens >= 2"):
        ContinuousSampler(graphdef, SamplingConfig(max_new_tokens=1), num_samples=G, slots=4, refill=2,
                          prompt_width=WIDTH)


@pytest.mark.skipif(jax.device_count() < 2, reason="needs the fake CPU devices from tests/conftest.py")
def test_rows_split_over_two_devices_give_the_same_stream(streamed):
    mesh, graphdef, state = tiny_decoder_on_two_devices()
    with jax.set_mesh(mesh):
        sampler = ContinuousSampler(graphdef, config(**SAMPLING), num_samples=G, slots=4, refill=2, prompt_width=WIDTH)
        chunks = list(sampler.stream(state, Source(), streamed["key"], max_prompts=len(PROMPTS)))
        assert sampler._decode._cache_size() == 1
    assert [c.payloads for c in chunks] == [c.payloads for c in streamed["chunks"]]
    for ours, ref in zip(chunks, streamed["chunks"]):
        assert_same_rollout(ref.rollout, ours.rollout)
