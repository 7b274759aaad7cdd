"""The turn engine: an append equals a fresh prefill of the whole conversation, stop sequences and
budgets end turns, and the shapes never change with the turns."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.agents.engine import EngineConfig, TurnEngine, ends_with_stop, _stop_table
from dapo_jax.models.decoder import positions_from_mask
from dapo_jax.sampling.config import SamplingConfig
from tests.agents.helpers import chain_decoder, random_decoder


def test_stop_table_matches_only_whole_sequences_at_the_end():
    table = _stop_table(((7, 8, 9), (4,)))
    np.testing.assert_array_equal(np.asarray(table), [[7, 8, 9], [-1, -1, 4]])
    window = jnp.asarray([[7, 8, 9], [-2, 8, 9], [9, 8, 7], [1, 2, 4], [4, 2, 1], [-2, -2, -2]], jnp.int32)
    assert np.asarray(ends_with_stop(window, table)).tolist() == [True, False, False, True, False, False]


@pytest.fixture(scope="module")
def random_engine():
    model = random_decoder()
    graphdef, state = nnx.split(model)
    cfg = EngineConfig(SamplingConfig(max_new_tokens=6, temperature=1.0, eos_token_ids=(1,)), cache_slots=40,
                       append_width=4, stop_sequences=((3,),))
    return model, state, TurnEngine(graphdef, cfg)


def test_appending_equals_a_fresh_forward_of_the_conversation(random_engine):
    """Two rows, ragged prompts and appends of 3 and 0 then 6 and 2 ids (two chunks): the next-token
    logits after the appends equal the model's cache-free forward over each row's real ids alone."""
    model, state, engine = random_engine
    prompts = [[5, 6, 7], [9]]
    ids = np.array([[5, 6, 7], [0, 0, 9]], np.int32)
    mask = np.array([[1, 1, 1], [0, 0, 1]], np.int32)
    es = engine.prefill(state, ids, mask)
    appends = [([10, 11, 12], []), ([13, 14, 15, 16, 17, 18], [19, 20])]
    for first, second in appends:
        for lo in range(0, max(len(first), len(second)), 4):
            chunk = np.zeros((2, 4), np.int32)
            n_new = np.zeros(2, np.int32)
            for r, seq in enumerate((first, second)):
                part = seq[lo:lo + 4]
                chunk[r, :len(part)], n_new[r] = part, len(part)
            es = engine.append(state, es, chunk, n_new)
    for r in range(2):
        seq = prompts[r] + sum((list(a[r]) for a in appends), [])
        x = jnp.asarray([seq], jnp.int32)
        m = jnp.ones_like(x)
        hidden, _ = model(x, positions_from_mask(m), m)
        want = np.asarray(model.logits(hidden[:, -1]))[0]
        np.testing.assert_allclose(np.asarray(es.logits[r]), want, rtol=1e-5, atol=1e-5)
        assert int(es.pos[r]) == len(seq)


def test_a_turn_stops_at_eos_stop_sequence_budget_and_a_full_cache():
    graphdef, state = nnx.split(chain_decoder())
    sampling = SamplingConfig(max_new_tokens=8, eos_token_ids=(20,))
    engine = TurnEngine(graphdef, EngineConfig(sampling, cache_slots=16, append_width=2, stop_sequences=((6, 7),)))
    # rows: 3 -> 4 5 6 7 (stop); 17 -> 18 19 20 (EOS); 10 -> budget 3; 25 inactive
    ids = np.array([[0, 3], [0, 17], [0, 10], [0, 25]], np.int32)
    mask = np.array([[0, 1]] * 4, np.int32)
    es = engine.prefill(state, ids, mask)
    es, out = engine.decode(state, es, np.array([1, 1, 1, 0], bool), np.array([8, 8, 3, 8], np.int32),
                            jax.random.key(0))
    assert np.asarray(out.count).tolist() == [4, 3, 3, 0]
    assert np.asarray(out.reason).tolist() == [2, 1, 3, 0]
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, :4], [[4, 5, 6, 7], [18, 19, 20, 0], [11, 12, 13, 0],
                                                                  [0, 0, 0, 0]])
    assert int(out.steps) == 4
    assert np.asarray(es.cache.end).tolist() == [6, 5, 5, 2]  # each row's own slots: prompt width + its ids
    assert np.asarray(es.pos).tolist() == [5, 4, 4, 1]  # one prompt id each, then the turn
    # eight ids appended to row 0 alone (four chunks of 2) leave it two free slots of its 16
    for lo in range(0, 8, 2):
        chunk = np.zeros((4, 2), np.int32)
        chunk[0] = [lo, lo + 1]
        es = engine.append(state, es, chunk, np.array([2, 0, 0, 0], np.int32))
    assert np.asarray(es.cache.end).tolist() == [14, 5, 5, 2]  # the idle rows took no slot
    es, out = engine.decode(state, es, np.array([1, 0, 0, 1], bool), np.full(4, 8, np.int32), jax.random.key(1))
    assert int(out.count[0]) == 2 and int(out.reason[0]) == 4  # two slots left, then row 0's cache is full
    np.testing.assert_array_equal(np.asarray(out.tokens)[0, :2], [8, 9])
    # row 3 idled through all of that: its whole budget of 8 fits in its own slots (2 + 8 <= 16)
    assert int(out.count[3]) == 8 and int(out.reason[3]) == 3
    np.testing.assert_array_equal(np.asarray(out.tokens)[3], np.arange(26, 34) % 32)
    assert np.asarray(es.cache.end).tolist() == [16, 5, 5, 10]
