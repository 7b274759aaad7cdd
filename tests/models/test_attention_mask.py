"""`models/attention_mask.py` against the mask rule written out in NumPy:
query i sees key j when j <= i, seg[i] == seg[j] and (branch[j] == 0 or branch[i] == branch[j])."""

import numpy as np

from dapo_jax.models.attention_mask import allowed, mask_ids, slice_ids


def numpy_ids(attention_mask, segment_ids):
    seg = np.where(attention_mask.astype(bool), segment_ids, -(np.arange(attention_mask.shape[-1]) + 1))
    return seg.astype(np.int32)


def numpy_allowed(seg, branch):
    b, s = seg.shape
    ok = np.zeros((b, s, s), bool)
    for r in range(b):
        for i in range(s):
            for j in range(s):
                ok[r, i, j] = j <= i and seg[r, i] == seg[r, j] and (branch is None or branch[r, j] == 0
                                                                    or branch[r, i] == branch[r, j])
    return ok


def test_padding_gets_its_own_negative_id_and_real_tokens_keep_theirs():
    mask = np.array([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]], np.int32)
    seg = np.array([[1, 1, 2, 0, 0], [0, 1, 1, 1, 1]], np.int32)
    ids = mask_ids(mask, seg)
    np.testing.assert_array_equal(ids.segment_ids, [[1, 1, 2, -4, -5], [-1, 1, 1, 1, 1]])
    assert ids.branch_ids is None
    np.testing.assert_array_equal(mask_ids(mask).segment_ids, [[1, 1, 1, -4, -5], [-1, 1, 1, 1, 1]])


def test_allowed_matches_the_rule_with_packing_branches_and_padding():
    rng = np.random.default_rng(0)
    b, s = 3, 9
    mask = (rng.random((b, s)) > 0.2).astype(np.int32)
    seg = np.sort(rng.integers(1, 3, (b, s)), axis=1).astype(np.int32)
    branch = rng.integers(0, 3, (b, s)).astype(np.int32)
    pos = np.arange(s)
    ids = mask_ids(mask, seg, branch)
    want = numpy_allowed(numpy_ids(mask, seg), branch)
    np.testing.assert_array_equal(np.asarray(allowed(ids, ids, pos, pos)), want)
    plain = mask_ids(mask, seg)
    np.testing.assert_array_equal(np.asarray(allowed(plain, plain, pos, pos)), numpy_allowed(numpy_ids(mask, seg), None))
    # one query block [3, 6) against all keys: the rows of the whole mask
    q = slice_ids(ids, 3, 6)
    np.testing.assert_array_equal(np.asarray(allowed(q, ids, pos[3:6], pos)), want[:, 3:6, :])
