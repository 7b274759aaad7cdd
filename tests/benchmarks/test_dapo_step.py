"""benchmarks/dapo_step.py: a batch it cannot split says so before anything is built or compiled (the phase itself
runs in `bash benchmarks/gpu_suite.sh --tiny`: minutes of compilation, too long for the default suite)."""

from __future__ import annotations

import types

import pytest

from benchmarks.dapo_step import phase_dapo_step


@pytest.mark.parametrize("gen_prompts, prompts, minibatches", [(4, 8, 1), (8, 6, 4)])
def test_a_batch_it_cannot_split_is_refused_first(gen_prompts, prompts, minibatches):
    args = types.SimpleNamespace(gen_prompts=gen_prompts, prompts=prompts, minibatches=minibatches, group=2,
                                 prompt_len=8, train_new_tokens=4, micro_batches=1)
    with pytest.raises(ValueError, match=f"--prompts {prompts} must be at most --gen-prompts {gen_prompts}"):
        phase_dapo_step(args, None, None, None, None, 0)
