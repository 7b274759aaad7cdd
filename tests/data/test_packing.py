"""Host-side sequence packing (data/packing.py) against hand-built layouts."""

import numpy as np
import pytest

from dapo_jax.data.packing import pack_groups, pack_with_tail, sequence_lengths, tail_heights


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
    assert [c.tokens.shape[0] for c in pack_with_tail(pids, pmask, rids, only_0, rows=2, tail_rows=1, length=7)] == [2]


def test_tails_come_in_every_multiple_of_tail_rows_and_take_the_fewest_rows():
    """Group 0 alone needs 2 rows of 7: with tails of multiples of 1 below 4 rows, one 2-row tail (not a
    1-row one, which does not hold it, nor 3 rows). _batch() whole takes 3 rows of 7 (group 0's 2, group 1's
    1): in a 3-row tail below 5 rows; below 6 rows in multiples of 2, one 4-row chunk rather than two 2-row
    ones (4 rows too: the taller on a tie)."""
    pids, pmask, rids, rmask = _batch()
    only_0 = rmask * np.array([1, 0])[:, None, None]
    assert [c.tokens.shape[0] for c in pack_with_tail(pids, pmask, rids, only_0, rows=4, tail_rows=1, length=7)] == [2]
    assert [c.tokens.shape[0] for c in pack_with_tail(pids, pmask, rids, rmask, rows=5, tail_rows=1, length=7)] == [3]
    assert [c.tokens.shape[0] for c in pack_with_tail(pids, pmask, rids, rmask, rows=6, tail_rows=2, length=7)] == [4]
    assert tail_heights(32, 8) == [8, 16, 24] and tail_heights(32, 16) == [16] and tail_heights(32, 0) == []


def test_shared_prompt_layout_matches_a_hand_built_case():
    """Both groups in one row of 14: group 0's prompt [5, 6] once (its first token as branch 0; its last
    token starts each branch), then group 1's [7, 8, 9] with its one response."""
    (c,) = pack_groups(*_batch(), rows=2, length=14, share_prompts=True)
    np.testing.assert_array_equal(c.tokens[0], [5, 6, 25, 26, 27, 28, 6, 21, 22, 7, 8, 9, 29, 0])
    np.testing.assert_array_equal(c.segment_ids[0], [1] * 9 + [2] * 4 + [0])
    np.testing.assert_array_equal(c.branch_ids[0], [0, 1, 1, 1, 1, 1, 2, 2, 2, 0, 0, 1, 1, 0])
    np.testing.assert_array_equal(c.positions[0], [0, 1, 2, 3, 4, 5, 1, 2, 3, 0, 1, 2, 3, 0])
    np.testing.assert_array_equal(c.targets[0], [6, 25, 26, 27, 28, 0, 21, 22, 0, 8, 9, 29, 0, 0])
    np.testing.assert_array_equal(c.index[0], [[6, 7, 0, 0], [1, 2, 3, 4]])
    np.testing.assert_array_equal(c.index[1, 0, :1], [11])
    assert not c.segment_ids[1].any() and c.groups.all()
    # without sharing the same row holds each response after its own copy of the prompt, one branch each
    (u,) = pack_groups(*_batch(), rows=2, length=14)
    np.testing.assert_array_equal(u.branch_ids[0], [0, 1, 1, 1, 1, 1, 0, 1, 1, 1, 0, 0, 1, 1])


def _sequences(chunk):
    """{(row, segment, branch): (tokens, positions)} of every branch's whole sequence (its prefix + itself)."""
    out = {}
    for r in range(chunk.tokens.shape[0]):
        for seg in set(chunk.segment_ids[r].tolist()) - {0}:
            in_seg = chunk.segment_ids[r] == seg
            prefix = in_seg & (chunk.branch_ids[r] == 0)
            for br in set(chunk.branch_ids[r][in_seg].tolist()) - {0}:
                sel = prefix | (in_seg & (chunk.branch_ids[r] == br))
                out[r, seg, br] = chunk.tokens[r][sel], chunk.positions[r][sel]
    return out


@pytest.mark.parametrize("share", [False, True])
def test_every_branch_reads_as_its_own_sequence(share):
    """Random batches, with and without shared prompts: each response's prefix + branch is exactly its
    (prompt, response) sequence with positions 0, 1, ...; its log-prob positions lie in that branch and
    predict its tokens; every response in one chunk; sharing computes fewer positions."""
    rng = np.random.default_rng(2)
    P, G, S, T = 6, 4, 6, 9
    saved = 0
    for trial in range(10):
        pmask = (np.arange(S) >= rng.integers(0, S - 1, P)[:, None]).astype(int)
        lengths = rng.integers(0, T + 1, (P, G))
        rmask = (np.arange(T) < lengths[..., None]).astype(np.float32)
        pids, rids = rng.integers(1, 50, (P, S)), rng.integers(1, 50, (P, G, T))
        chunks = pack_with_tail(pids, pmask, rids, rmask, rows=G, tail_rows=1, length=2 * (S + T),
                                share_prompts=share)
        np.testing.assert_array_equal(np.sum([c.valid for c in chunks], axis=0), rmask)
        found = 0
        for c in chunks:
            seqs = _sequences(c)
            for p, g in zip(*np.nonzero(c.valid.any(-1))):
                n = int(lengths[p, g])
                want = np.concatenate([pids[p][pmask[p] > 0], rids[p, g, :n]])
                r, col = np.divmod(c.index[p, g, :n], c.tokens.shape[1])
                assert len(set(r.tolist())) == 1 and np.all(np.diff(col) == 1)
                key = (r[0], c.segment_ids[r[0], col[0]], c.branch_ids[r[0], col[0]])
                toks, pos = seqs[key]
                np.testing.assert_array_equal(toks, want)
                np.testing.assert_array_equal(pos, np.arange(len(want)))
                np.testing.assert_array_equal(c.targets[r, col], rids[p, g, :n])
                found += 1
        assert found == int((lengths > 0).sum())
        unshared = pack_with_tail(pids, pmask, rids, rmask, rows=G, tail_rows=1, length=2 * (S + T))
        saved += sum(int((c.segment_ids > 0).sum()) for c in unshared) - sum(int((c.segment_ids > 0).sum()) for c in chunks)
    assert (saved > 0) if share else saved == 0


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
