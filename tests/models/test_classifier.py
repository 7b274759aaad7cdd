"""Classifiers (a decoder trunk + a score head) against transformers' own classes (PyTorch, CPU, float32),
on small random checkpoints that transformers writes itself: the pooled sequence score, the per-token
logits, pooling and the head's sharding rules. Reading and writing classifier folders (the PRM head layout,
our export, the refusals) is tested in test_hf_classifier_io.py."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from dapo_jax.models.classifier import classifier_partition_spec, last_token_index, sequence_logits
from dapo_jax.models.decoder import positions_from_mask
from dapo_jax.models.hf_classifier_io import classifier_head_layout, load_classifier

ATOL = 1e-5
PAD = 0
TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=128, pad_token_id=PAD, attn_implementation="eager")
FAMILIES = {"qwen2": "Qwen2", "llama": "Llama", "qwen3": "Qwen3"}


def spread(model, seed):
    """Weights beyond HF's N(0, 0.02) init, so that scores are O(1) and the comparison has teeth."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn_like(p) if name.endswith("norm.weight") else 0.1 * torch.randn_like(p))
    return model.eval()


def hf_classifier(family, task, num_labels, seed=0):
    prefix = FAMILIES[family]
    cfg = getattr(transformers, f"{prefix}Config")(**TINY, num_labels=num_labels,
                                                   **({"head_dim": 16} if family == "qwen3" else {}))
    cls = getattr(transformers, f"{prefix}For{'SequenceClassification' if task == 'sequence' else 'TokenClassification'}")
    return spread(cls(cfg), seed)


def batch(side, seed=0):
    """Three rows of 9, 5 and 2 real tokens (never the pad id), padded on `side` with PAD."""
    lengths, s = [9, 5, 2], 9
    rng = np.random.default_rng(seed)
    ids = np.full((3, s), PAD, np.int64)
    mask = np.zeros((3, s), np.int64)
    for b, n in enumerate(lengths):
        at = slice(s - n, s) if side == "left" else slice(0, n)
        ids[b, at], mask[b, at] = rng.integers(3, 64, n), 1
    return ids, mask


def ours(model, ids, mask):
    return np.asarray(model(jnp.asarray(ids, jnp.int32), positions_from_mask(jnp.asarray(mask)), jnp.asarray(mask)))


@pytest.mark.parametrize("family", FAMILIES)
def test_sequence_score_equals_transformers_either_padding_batched(family, tmp_path):
    ref = hf_classifier(family, "sequence", 1)
    ref.save_pretrained(tmp_path)
    model = load_classifier(tmp_path)
    assert (model.head, model.num_labels) == ("linear", 1)
    for side in ("left", "right"):
        ids, mask = batch(side)
        with torch.no_grad():  # transformers' own forward: its positions, its pooling at the last non-pad token
            want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
        got = np.asarray(sequence_logits(jnp.asarray(ours(model, ids, mask)), jnp.asarray(ids), jnp.asarray(mask),
                                         pad_token_id=model.config.pad_token_id))
        assert got.shape == want.shape == (3, 1) and got.dtype == np.float32
        assert np.abs(want).max() > 0.1
        np.testing.assert_allclose(got, want, atol=ATOL, rtol=0)
        for b in range(3):  # batched = one row alone, unpadded
            real = mask[b].astype(bool)
            with torch.no_grad():
                alone = ref(input_ids=torch.tensor(ids[b:b + 1, real])).logits.numpy()
            np.testing.assert_allclose(got[b:b + 1], alone, atol=ATOL, rtol=0)


@pytest.mark.parametrize("family", FAMILIES)
def test_token_logits_equal_transformers(family, tmp_path):
    ref = hf_classifier(family, "token", 2, seed=1)
    ref.save_pretrained(tmp_path)
    model = load_classifier(tmp_path)
    assert (model.head, model.num_labels, classifier_head_layout(tmp_path)[2]) == ("linear", 2, True)
    for side in ("left", "right"):
        ids, mask = batch(side, seed=2)
        with torch.no_grad():
            want = ref(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
        got = ours(model, ids, mask)
        real = mask.astype(bool)
        np.testing.assert_allclose(got[real], want[real], atol=ATOL, rtol=0)


def test_pooling_takes_the_rightmost_non_pad_token_as_transformers_does():
    ids = jnp.asarray([[5, 6, 7, 0, 0], [0, 0, 5, 6, 7], [5, 0, 7, 0, 0], [0, 0, 0, 0, 0]])
    mask = (ids != 0).astype(jnp.int32)
    assert last_token_index(ids, mask, 0).tolist() == [2, 4, 2, 0]
    # no pad token id: the last real position of the mask
    assert last_token_index(ids, jnp.asarray([[1, 1, 1, 1, 0]] * 4), None).tolist() == [3] * 4


def test_head_parameters_have_sharding_rules():
    from jax.sharding import PartitionSpec as P

    assert classifier_partition_spec(("score", "kernel")) == P("fsdp", None)
    assert classifier_partition_spec(("score", "out", "bias")) == P()
    assert classifier_partition_spec(("trunk", "layers", 0, "mlp", "up_proj", "kernel")) == P("fsdp", "tensor")
