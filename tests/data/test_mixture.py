"""MixtureStream: seeded draws by weight, each source in its own stream's order, exact resume, skipping."""

import numpy as np
import pytest

from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.data.datasets import Problem
from dapo_jax.data.mixture import BLOCK, MIX_SALT, MixtureStream, SourceExhausted
from dapo_jax.data.stream import PromptStream, StreamMismatch

TOK = build_char_tokenizer()


def stream(letter: str, n: int, seed: int = 0, key: str | None = None) -> PromptStream:
    problems = [Problem(problem=f"{letter}{i}", answer=str(i), index=i) for i in range(n)]
    return PromptStream(problems, TOK, max_prompt_length=8, seed=seed,
                        source={"key": key or f"data.sources.{letter}", "name": letter, "path": None})


def mixture(weights=(3.0, 1.0), seed=0, sizes=(11, 5)) -> MixtureStream:
    return MixtureStream({"a": stream("a", sizes[0]), "b": stream("b", sizes[1])},
                         {"a": weights[0], "b": weights[1]}, seed=seed)


def reference_sources(seed: int, p, n: int) -> list[int]:
    """The documented draw: block b of rng([seed, MIX_SALT, b]).choice(S, BLOCK, p)."""
    out = []
    for b in range(n // BLOCK + 1):
        out += np.random.default_rng([seed, MIX_SALT, b]).choice(len(p), size=BLOCK, p=p).tolist()
    return out[:n]


def test_each_draw_takes_its_source_by_the_seeded_choice_and_that_source_s_own_order():
    n = BLOCK + 300  # across a block boundary
    mix = mixture(seed=5)
    got = mix.next_examples(n)
    want = reference_sources(5, np.array([0.75, 0.25]), n)
    assert [e.source for e in got] == want
    # within a source, the prompts come in that source's own PromptStream order (its seeded epochs)
    for s, (letter, size) in enumerate((("a", 11), ("b", 5))):
        alone = stream(letter, size).next_examples(want.count(s))
        assert [e.text for e in got if e.source == s] == [e.text for e in alone]
    # the proportion is the weight's (3:1), within sampling error over 4396 draws
    assert abs(np.mean(want) - 0.25) < 0.03
    assert mix.drawn == n


def test_seed_changes_the_draws_and_batches_are_padded_to_one_shape():
    a = [e.source for e in mixture(seed=0).next_examples(64)]
    b = [e.source for e in mixture(seed=1).next_examples(64)]
    assert a != b
    batch = mixture().next_batch(6)
    assert batch.input_ids.shape == (6, 8) and (batch.attention_mask[:, -1] == 1).all()
    assert [e.source for e in batch.examples] == reference_sources(0, np.array([0.75, 0.25]), 6)


@pytest.mark.parametrize("first", [1, 7, 16, BLOCK + 3])
def test_resume_from_the_state_continues_exactly(first):
    full = mixture(seed=3)
    straight = [(e.source, e.index) for e in full.next_examples(first + 40)]
    part = mixture(seed=3)
    part.next_examples(first)
    resumed = mixture(seed=3)
    assert resumed.load_state_dict(part.state_dict()) == []
    assert [(e.source, e.index) for e in resumed.next_examples(40)] == straight[first:]


def test_a_changed_mixture_is_refused_in_one_line_unless_accepted():
    saved = mixture(seed=3)
    saved.next_examples(9)
    state = saved.state_dict()
    with pytest.raises(StreamMismatch, match=r"data.sources: .*weights \[3.0, 1.0\] .* \[1.0, 1.0\]"):
        mixture(weights=(1.0, 1.0), seed=3).load_state_dict(state)
    assert mixture(weights=(1.0, 1.0), seed=3).load_state_dict(state, accept_changed=True)
    with pytest.raises(StreamMismatch, match=r"sources \['a', 'b'\], now \['a'\].*data.new_round=true"):
        MixtureStream({"a": stream("a", 11)}, {"a": 1.0}).load_state_dict(state)
    with pytest.raises(StreamMismatch, match="not a mixture's"):
        mixture().load_state_dict(stream("a", 11).state_dict())
    with pytest.raises(StreamMismatch, match="data.sources.b"):  # a source's prompts changed
        mixture(seed=3, sizes=(11, 6)).load_state_dict(state)


def test_skipped_prompts_are_never_drawn_and_an_all_skipped_source_raises():
    mix = mixture(seed=2)
    mix.set_skip(lambda s, e: s == 0 and e.index % 2 == 0, ": skipped by the test")
    got = mix.next_examples(200)
    assert not [e for e in got if e.source == 0 and e.index % 2 == 0]
    assert {e.index for e in got if e.source == 0} == {1, 3, 5, 7, 9}
    mix.set_skip(lambda s, e: s == 1, ": skipped by the test")
    with pytest.raises(SourceExhausted, match=r"^data.sources.b: every one of its 5 prompts is skipped: skipped by"):
        mix.next_examples(200)


def test_bad_weights_and_mismatched_streams_are_refused():
    with pytest.raises(ValueError, match="weights"):
        mixture(weights=(1.0, 0.0))
    long = PromptStream([Problem(problem="c", answer="1", index=0)], TOK, max_prompt_length=16)
    with pytest.raises(ValueError, match="buckets"):
        MixtureStream({"a": stream("a", 3), "c": long}, {"a": 1.0, "c": 1.0})
