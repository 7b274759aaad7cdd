"""Left padding into length buckets: exact values, masks, bucket choice, errors."""

import numpy as np
import pytest

from dapo_jax.data.batching import bucket_length, default_buckets, left_pad


def test_default_buckets():
    assert default_buckets(100) == (16, 32, 64, 100)
    assert default_buckets(64) == (16, 32, 64)
    assert default_buckets(8) == (8,)
    assert default_buckets(40, smallest=8) == (8, 16, 32, 40)


def test_bucket_length():
    assert bucket_length(1, (16, 32)) == 16
    assert bucket_length(16, (32, 16)) == 16
    assert bucket_length(17, (16, 32)) == 32
    with pytest.raises(ValueError, match="33 tokens is longer than the largest bucket 32"):
        bucket_length(33, (16, 32))


def test_left_pad_values_by_hand():
    ids, mask = left_pad([[5, 6, 7], [8], []], pad_id=0, buckets=(2, 4, 8))
    np.testing.assert_array_equal(ids, [[0, 5, 6, 7], [0, 0, 0, 8], [0, 0, 0, 0]])
    np.testing.assert_array_equal(mask, [[0, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]])
    assert ids.dtype == mask.dtype == np.int32


def test_left_pad_fixed_length_and_no_buckets():
    ids, mask = left_pad([[1, 2]], pad_id=9, length=5)
    np.testing.assert_array_equal(ids, [[9, 9, 9, 1, 2]])
    np.testing.assert_array_equal(mask, [[0, 0, 0, 1, 1]])
    ids, _ = left_pad([[1, 2], [3]], pad_id=9)
    np.testing.assert_array_equal(ids, [[1, 2], [9, 3]])
    with pytest.raises(ValueError, match="3 tokens does not fit length 2"):
        left_pad([[1, 2, 3]], pad_id=0, length=2)
