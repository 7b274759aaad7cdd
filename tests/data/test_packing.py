"""Host-side sequence packing (data/packing.py) against hand-built layouts."""

import numpy as np
import pytest

from dapo_jax.data.packing import pack_groups, pack_with_tail, sequence_lengths


def _batch():
    # prompts [P=2, S=3] left-padded; responses [P, G=2, T=4]
    prompt_ids = np.array([[0, 5, 6], [7, 8, 9]])
    prompt_mask = np.array([[0, 1, 1], [1, 1, 1]])
    response_ids = np.arange(1, 17).reshape(2, 2, 4) + 20
    response_mask = np.zeros((2, 2, 4), np.float32)
    response_mask[0, 0, :2] = 1  # 2 + 2 tokens
    response_mask[0, 1, :4] = 1  # 2 + 4 tokens
    response_mask[1, 0, :1] = 1  # 3 + 1 tokens; (1, 1) is empty and left out
    return prompt_ids, prompt_mask, response_ids, response_mask


def test_layout_matches_a_hand_built_case():
    chunks = pack_groups(*_batch(), rows=2, length=7)
    assert len(chunks) == 2  # group 0 (10 tokens) fills 6 + 4 of the two rows; group 1 (4) needs a new chunk
    c0, c1 = chunks
    np.testing.assert_array_equal(c0.tokens, [[5, 6, 25, 26, 27, 28, 0], [5, 6, 21, 22, 0, 0, 0]])
    np.testing.assert_array_equal(c0.segment_ids, [[1, 1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0, 0]])
    np.testing.assert_array_equal(c0.positions, [[0, 1, 2, 3, 4, 5, 0], [0, 1, 2, 3, 0, 0, 0]])
    np.testing.assert_array_equal(c0.targets, [[6, 25, 26, 27, 28, 0, 0], [6, 21, 22, 0, 0, 0, 0]])
    # response (0, 0) token t is predicted at row 1, column 1 + t -> flat 7 + 1 + t
    np.testing.assert_array_equal(c0.index[0], [[8, 9, 0, 0], [1, 2, 3, 4]])
    np.testing.assert_array_equal(c0.valid[0], [[1, 1, 0, 0], [1, 1, 1, 1]])
    assert not c0.valid[1].any() and c0.groups.tolist() == [True, False]
    np.testing.assert_array_equal(c1.tokens[0], [7, 8, 9, 29, 0, 0, 0])
    assert not c1.segment_ids[1].any() and c1.groups.tolist() == [False, True]
    assert c1.index[1, 0, 0] == 2 and c1.valid[1].sum() == 1


def test_several_sequences_share_a_row_with_their_own_segments():
    pids, pmask, rids, rmask = _batch()
    (c,) = pack_groups(pids, pmask, rids, rmask, rows=2, length=14)
    # first fit: row 0 takes (0, 1) [6 tokens], (0, 0) [4] and group 1's (1, 0) [4]; row 1 stays empty
    np.testing.assert_array_equal(c.segment_ids[0], [1] * 6 + [2] * 4 + [3] * 4)
    assert not c.segment_ids[1].any() and c.groups.all()
    np.testing.assert_array_equal(c.positions[0, 6:10], [0, 1, 2, 3])
    assert c.targets[0, 5] == 0 and c.targets[0, 9] == 0  # a segment's last token predicts nothing
    np.testing.assert_array_equal(c.index[0, 0, :2], [6 + 1, 6 + 2])
    # every gathered position holds the token before the one it predicts, in the same segment
    flat_t, flat_s = c.targets.reshape(-1), c.segment_ids.reshape(-1)
    for p, g, t in zip(*np.nonzero(c.valid)):
        assert flat_t[c.index[p, g, t]] == rids[p, g, t] and flat_s[c.index[p, g, t]] > 0


def test_every_token_is_packed_once_and_groups_stay_whole():
    rng = np.random.default_rng(0)
    P, G, S, T = 6, 4, 5, 9
    pmask = (np.arange(S) >= rng.integers(0, S, P)[:, None]).astype(int)
    lengths = rng.integers(0, T + 1, (P, G))
    rmask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    pids, rids = rng.integers(1, 50, (P, S)), rng.integers(1, 50, (P, G, T))
    chunks = pack_groups(pids, pmask, rids, rmask, rows=G, length=S + T)
    assert sum(int((c.segment_ids > 0).sum()) for c in chunks) == int((pmask.sum(1)[:, None] * (lengths > 0) + lengths).sum())
    valid = np.sum([c.valid for c in chunks], axis=0)
    np.testing.assert_array_equal(valid, rmask)  # each response token in exactly one chunk
    for c in chunks:  # a chunk holds all of a group's tokens or none
        np.testing.assert_array_equal(c.valid.any(-1) | (lengths == 0), np.repeat(c.groups[:, None], G, 1) | (lengths == 0))
    assert len(chunks) < P  # the short sequences share rows


def test_the_last_chunks_groups_move_to_a_tail_chunk_when_it_takes_fewer_rows():
    """_batch() in chunks of 2 rows x 7: group 0 fills chunk 0, group 1 (4 tokens) alone takes chunk 1.
    With tail_rows=1 that second chunk becomes one row, laid out as pack_groups lays it in a 1-row chunk."""
    batch = _batch()
    c0, c1 = pack_groups(*batch, rows=2, length=7)
    t0, t1 = pack_with_tail(*batch, rows=2, tail_rows=1, length=7)
    assert t0.tokens.shape == (2, 7) and t1.tokens.shape == (1, 7)
    for a, b in zip(c0, t0):
        np.testing.assert_array_equal(a, b)  # the full chunks are untouched
    np.testing.assert_array_equal(t1.tokens, c1.tokens[:1])
    np.testing.assert_array_equal(t1.index, c1.index)  # row 0 of either: the same flat positions
    np.testing.assert_array_equal(t1.valid, c1.valid)
    assert t1.groups.tolist() == [False, True]
    # no tail when switched off
    assert [c.tokens.shape[0] for c in pack_with_tail(*batch, rows=2, tail_rows=0, length=7)] == [2, 2]
    # no tail when it takes as many rows: both groups fit one 3-row chunk, but 2-row tails need two (4 rows)
    assert [c.tokens.shape[0] for c in pack_with_tail(*batch, rows=3, tail_rows=2, length=7)] == [3]
    # no tail when a group does not fit it: group 0's sequences (6 and 4 tokens) need two rows of 7
    pids, pmask, rids, rmask = batch
    only_0 = rmask * np.array([1, 0])[:, None, None]
    assert [c.tokens.shape[0] for c in pack_with_tail(pids, pmask, rids, only_0, rows=4, tail_rows=1, length=7)] == [4]


def test_tails_pack_every_token_once_and_keep_groups_whole():
    rng = np.random.default_rng(1)
    P, G, S, T = 8, 4, 5, 9
    for trial in range(20):
        pmask = (np.arange(S) >= rng.integers(0, S - 1, P)[:, None]).astype(int)
        lengths = rng.integers(0, T + 1, (P, G))
        rmask = (np.arange(T) < lengths[..., None]).astype(np.float32)
        pids, rids = rng.integers(1, 50, (P, S)), rng.integers(1, 50, (P, G, T))
        chunks = pack_with_tail(pids, pmask, rids, rmask, rows=2 * G, tail_rows=G, length=S + T)
        np.testing.assert_array_equal(np.sum([c.valid for c in chunks], axis=0), rmask)
        assert np.sum([c.groups for c in chunks], axis=0).tolist() == (lengths.sum(1) > 0).astype(int).tolist()
        for c in chunks:
            flat_t = c.targets.reshape(-1)
            for p, g, t in zip(*np.nonzero(c.valid)):
                assert flat_t[c.index[p, g, t]] == rids[p, g, t]
        rows = [c.tokens.shape[0] for c in chunks]
        assert rows.count(G) <= 1 and sum(rows) <= 2 * G * len(pack_groups(pids, pmask, rids, rmask, rows=2 * G,
                                                                              length=S + T))


def test_errors_name_the_problem():
    pids, pmask, rids, rmask = _batch()
    bad = rmask.copy()
    bad[0, 0, 3] = 1  # a hole
    with pytest.raises(ValueError, match=r"ones then zeros; response \(0, 0\)"):
        sequence_lengths(pmask, bad)
    with pytest.raises(ValueError, match="does not fit a row of 5"):
        pack_groups(pids, pmask, rids, rmask, rows=2, length=5)
    with pytest.raises(ValueError, match="does not fit one chunk of 1 rows"):
        pack_groups(pids, pmask, rids, rmask, rows=1, length=7)
