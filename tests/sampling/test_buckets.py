"""pad_to_bucket: left padding to the smallest fitting bucket, from lists or padded arrays."""

import numpy as np
import pytest

from dapo_jax.sampling import pad_to_bucket


def test_lists_are_left_padded_to_the_smallest_bucket():
    ids, mask = pad_to_bucket([[1, 2, 3], [4], np.array([5, 6])], buckets=(8, 4, 16), pad_id=9)
    np.testing.assert_array_equal(ids, [[9, 1, 2, 3], [9, 9, 9, 4], [9, 9, 5, 6]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 1, 1]])
    assert ids.dtype == np.int32 and mask.dtype == np.int32
    ids, _ = pad_to_bucket([[1, 2, 3, 4, 5]], buckets=(4, 8), pad_id=0)
    assert ids.shape == (1, 8)  # 5 tokens do not fit 4


def test_arrays_with_a_mask_are_repacked_to_the_left():
    ids = np.array([[1, 2, 0, 0], [0, 3, 4, 5]])  # right- and left-padded rows
    mask = np.array([[1, 1, 0, 0], [0, 1, 1, 1]])
    out, out_mask = pad_to_bucket(ids, buckets=(4,), pad_id=7, mask=mask)
    np.testing.assert_array_equal(out, [[7, 7, 1, 2], [7, 3, 4, 5]])
    np.testing.assert_array_equal(out_mask, [[0, 0, 1, 1], [0, 1, 1, 1]])
    out, out_mask = pad_to_bucket(np.array([[4, 5]]), buckets=(3,), pad_id=0)  # no mask: all real
    np.testing.assert_array_equal(out, [[0, 4, 5]])


@pytest.mark.parametrize("prompts, match", [
    ([[1] * 5, [2] * 9], "row 1 has 9 tokens"),
    ([[1, 2], []], "row 1 is empty"),
    ([[1.5, 2.0]], "row 0 has non-integer"),
    ([], "no prompts"),
])
def test_bad_input_names_the_row(prompts, match):
    with pytest.raises(ValueError, match=match):
        pad_to_bucket(prompts, buckets=(4, 8), pad_id=0)
