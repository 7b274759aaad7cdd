"""Greedy rollouts equal transformers `generate(do_sample=False)` token for token (left-padded batches)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from tests.sampling.sampling_hf_reference import decoder_from_torch, tiny_hf_config, torch_model  # noqa: E402

from dapo_jax.sampling import SamplingConfig, generate, pad_to_bucket  # noqa: E402

PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [3, 4, 5, 6, 7, 8, 9, 10], [42]]
T = 12


def hf_greedy(tm, ids, mask, eos=None):
    with torch.no_grad():
        out = tm.generate(torch.from_numpy(ids.astype(np.int64)), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                          max_new_tokens=T, do_sample=False, pad_token_id=0, eos_token_id=eos,
                          output_scores=True, return_dict_in_generate=True)
    seq = out.sequences[:, ids.shape[1]:].numpy()
    scores = torch.stack(out.scores, 1).numpy()  # [B, T', V]
    top2 = np.sort(scores, -1)[..., -2:]
    return seq, top2[..., 1] - top2[..., 0]


@pytest.mark.parametrize("model_type, extra", [
    ("qwen2", {}),
    ("llama", {"attention_bias": False}),
    ("qwen3", {"head_dim": 16}),
])
def test_greedy_matches_transformers(model_type, extra):
    hf = tiny_hf_config(model_type, **extra)
    tm = torch_model(hf, seed=1)
    model = decoder_from_torch(tm, hf)
    ids, mask = pad_to_bucket(PROMPTS, (8,), pad_id=0)
    want, margin = hf_greedy(tm, ids, mask)
    assert margin.min() > 1e-4, "near-tie in the reference: pick another seed"
    config = SamplingConfig(max_new_tokens=T, greedy=True, eos_token_ids=(), pad_token_id=0)
    rollout = generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), num_samples=2, config=config)
    for g in range(2):
        np.testing.assert_array_equal(rollout.response_ids[:, g], want)
    assert np.asarray(rollout.truncated).all() and (np.asarray(rollout.lengths) == T).all()


def test_greedy_with_eos_matches_transformers_padding():
    hf = tiny_hf_config("qwen2")
    tm = torch_model(hf, seed=1)
    model = decoder_from_torch(tm, hf)
    ids, mask = pad_to_bucket(PROMPTS, (8,), pad_id=0)
    free, _ = hf_greedy(tm, ids, mask)
    eos = int(free[0, 3])  # row 0 stops at (or before) its 4th token; the others wherever this id shows up
    want, _ = hf_greedy(tm, ids, mask, eos=eos)
    want = np.pad(want, ((0, 0), (0, T - want.shape[1])))  # HF stops early when every row is done
    config = SamplingConfig(max_new_tokens=T, greedy=True, eos_token_ids=(eos,), pad_token_id=0)
    rollout = generate(model, jnp.asarray(ids), jnp.asarray(mask), jax.random.key(0), num_samples=1, config=config)
    got = np.asarray(rollout.response_ids[:, 0])
    np.testing.assert_array_equal(got, want)
    lengths = np.asarray(rollout.lengths[:, 0])
    assert 1 <= lengths[0] <= 4 and (lengths < T).any()
    for row, n in zip(want, lengths):
        hit = np.flatnonzero(row == eos)
        assert n == (hit[0] + 1 if hit.size else T)
