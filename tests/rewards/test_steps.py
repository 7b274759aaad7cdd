"""Step rewards (process supervision) on hand-written chain-of-thought traces, and their token ends."""

import numpy as np
import pytest

from dapo_jax.data import cot
from dapo_jax.data.char_tokenizer import build_char_tokenizer
from dapo_jax.rewards.steps import STEP_REWARDS, cot_steps, make_step_scorer, step_arrays, synthetic_steps
from dapo_jax.objectives.process import process_advantages

PROMPT = "a5+b7+c4+d3="  # running sums 5, 12, 16, 19


def line_ends(text):
    """Index of the last non-blank character of every non-blank line, written out by hand-ish means."""
    ends, pos = [], 0
    for line in text.split("\n"):
        if line.strip():
            ends.append(pos + len(line.rstrip()) - 1)
        pos += len(line) + 1
    return ends


def test_reference_trace_every_line_right_and_ends_on_each_lines_last_character():
    text = "a5+b7=12\n12+c4=16\n16+d3=19\nAnswer: 19"
    assert text == cot.solution(PROMPT)
    assert cot_steps(text, PROMPT, "19") == [(1.0, 7), (1.0, 16), (1.0, 25), (1.0, 36)]


@pytest.mark.parametrize("text, rewards, missing", [
    # a slip carried on: every running sum from the slip on is wrong, and so is the answer
    ("a5+b7=12\n12+c4=17\n17+d3=20\nAnswer: 20", [1, -1, -1, -1], 0),
    # a slip corrected on the next line: judged against the truth, each line on its own
    ("a5+b7=12\n12+c4=17\n16+d3=19\nAnswer: 19", [1, -1, 1, 1], 0),
    # terse (two terms a line) and verbose (Total lines restate the last running sum; d's sum is missing)
    ("a5+b7+c4=16\n16+d3=19\nAnswer: 19", [1, 1, 1], 0),
    ("a5+b7=12\nTotal: 12\n12+c4=16\nTotal: 15\nAnswer: 19", [1, 1, 1, -1, 1], 1),
    # blank lines are not steps; garbage, unknown labels and a Total before any sum are -1, and a label
    # past the last term does not count as reaching it (c's and d's sums are missing)
    ("Total: 5\n\na5+b7=12\n  \n12+x4=16\nhello\nAnswer: 19\n", [-1, 1, -1, -1, 1], 2),
    # cut off before the Answer line (d's sum and the answer missing), then text after an Answer line
    ("a5+b7=12\n12+c4=16\n16+d", [1, 1, -1], 2),
    ("a5+b7=12\n12+c4=16\n16+d3=19\nAnswer: 18\nAnswer: 19", [1, 1, 1, -1, 1], 0),
    ("", [], 4),  # nothing written: three running sums and the answer missing
])
def test_hand_written_traces(text, rewards, missing):
    """Each line is a step ending on its last character; each line the solution still needed is one
    more -1 step at the response's last character."""
    steps = cot_steps(text, PROMPT, "19")
    assert [r for r, _ in steps] == rewards + [-1] * missing
    assert [e for _, e in steps] == line_ends(text) + [len(text)] * missing  # past the text: the stop token


def test_stopping_early_never_sums_to_more_than_going_on_wrong():
    """With +1 per right line and nothing for what was not written, a response that writes one right line
    and stops has only +1 steps. Every line the solution still needed counts -1, so in the sum of step
    rewards stopping is no better than a slip (the group-normalised advantage is another matter:
    docs/league.md)."""
    assert cot_steps("a5+b7=12", PROMPT, "19") == [(1.0, 7), (-1.0, 8), (-1.0, 8), (-1.0, 8)]  # 8: the stop
    stop = sum(r for r, _ in cot_steps("a5+b7=12\n12+c4=16", PROMPT, "19"))
    slip = sum(r for r, _ in cot_steps("a5+b7=12\n12+c4=16\n16+d3=20\nAnswer: 20", PROMPT, "19"))
    right = sum(r for r, _ in cot_steps(cot.solution(PROMPT), PROMPT, "19"))
    assert stop == slip == 0 and right == 4
    # a right answer that skips the lines is still missing them
    assert cot_steps("Answer: 19", PROMPT, "19") == [(1.0, 9), (-1.0, 10), (-1.0, 10), (-1.0, 10)]


def test_prompt_inside_a_template_and_a_prompt_without_a_problem():
    assert cot_steps("a5+b7=12", "Solve:\na5+b7+c4+d3=\n", "19") == [(1.0, 7)] + [(-1.0, 8)] * 3
    with pytest.raises(ValueError, match="no cot problem"):
        cot_steps("a5+b7=12", "what is 5+7?", "12")


def test_synthetic_steps_one_step_per_line():
    assert synthetic_steps("19", "12+7=", "19") == [(1.0, 1)]
    assert synthetic_steps("18", "12+7=", "19") == [(-1.0, 1)]
    assert synthetic_steps("19\n19", "12+7=", "19") == [(1.0, 1), (1.0, 4)]
    assert set(STEP_REWARDS) == {"cot", "synthetic"}


def test_token_ends_with_multi_character_pieces():
    # pieces: "a5+", "b7", "=12\n", "12", "+c4=1", "7", "" (EOS), then padding
    pieces = [["a5+", "b7", "=12\n", "12", "+c4=1", "7", ""]]
    rewards, ends, mask = step_arrays(cot_steps, pieces, ["a5+b7+c4="], ["16"], max_steps=4)
    np.testing.assert_array_equal(rewards, [[1, -1, -1, 0]])  # the third: the missing answer
    np.testing.assert_array_equal(ends, [[2, 5, 6, 0]])  # "=12\n" holds line 1's last char, "7" line 2's; "" the stop
    np.testing.assert_array_equal(mask, [[1, 1, 1, 0]])
    _, _, mask = step_arrays(cot_steps, pieces, ["a5+b7+c4="], ["16"], max_steps=1)  # surplus steps dropped
    np.testing.assert_array_equal(mask, [[1]])


def test_step_scorer_on_token_ids_of_the_character_tokenizer():
    tok = build_char_tokenizer()
    texts = ["a5+b7=12\n12+c4=17\nAnswer: 19", "a5+b7=12\n12+c4=16\n16+d3=19\nAnswer: 19"]
    T = 40
    ids = np.full((1, 2, T), tok.pad_token_id, np.int32)
    mask = np.zeros((1, 2, T), np.float32)
    for g, text in enumerate(texts):
        row = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        assert len(row) == len(text) + 1  # one token per character
        ids[0, g, : len(row)] = row
        mask[0, g, : len(row)] = 1
    ids[0, 0, len(texts[0]) + 1] = tok.encode("7", add_special_tokens=False)[0]  # past the mask: never read
    out = make_step_scorer("cot", tok)(ids, mask, [PROMPT], ["19"])
    assert {k: v.shape for k, v in out.items()} == {k: (1, 2, T) for k in ("step_rewards", "step_ends", "step_mask")}
    for g, text in enumerate(texts):
        steps = cot_steps(text, PROMPT, "19")
        n = len(steps)
        np.testing.assert_array_equal(out["step_rewards"][0, g, :n], [r for r, _ in steps])
        # 1 char = 1 token, and a step past the text (a missing line) ends on the EOS, token len(text)
        np.testing.assert_array_equal(out["step_ends"][0, g, :n], [min(e, len(text)) for _, e in steps])
        assert out["step_mask"][0, g].sum() == n
    np.testing.assert_array_equal(out["step_rewards"][0, 0, :3], [1, -1, 1])
    with pytest.raises(KeyError, match="no step rewards"):
        make_step_scorer("gsm8k", tok)


def test_stopping_after_an_incomplete_chain_gives_the_eos_a_negative_advantage():
    """The missing lines' -1 steps end on the stop token, so the decision to stop is scored: the EOS of
    a response that stopped after two right lines gets a negative advantage (by hand below), where it
    used to get 0 (every step ended before it), while the complete response's EOS stays at 0."""
    tok = build_char_tokenizer()
    texts = ["a5+b7=12\n12+c4=16\n16+d3=19\nAnswer: 19", "a5+b7=12\n12+c4=16"]  # complete; stops early
    T = 48
    ids = np.full((1, 2, T), tok.pad_token_id, np.int32)
    mask = np.zeros((1, 2, T), np.float32)
    for g, text in enumerate(texts):
        row = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
        ids[0, g, : len(row)], mask[0, g, : len(row)] = row, 1
    out = make_step_scorer("cot", tok)(ids, mask, [PROMPT], ["19"])
    adv = np.asarray(process_advantages(out["step_rewards"], out["step_ends"], out["step_mask"], mask))
    # steps of the group: complete +1 x4; early +1, +1, then -1 (d's sum) and -1 (the answer) on its EOS
    r = np.array([1, 1, 1, 1, 1, 1, -1, -1], float)
    z = (r - r.mean()) / (r.std(ddof=1) + 1e-6)
    eos_early, eos_complete = len(texts[1]), len(texts[0])
    assert out["step_ends"][0, 1, 2] == out["step_ends"][0, 1, 3] == eos_early
    np.testing.assert_allclose(adv[0, 1, eos_early], 2 * z[-1], rtol=1e-5)  # both missing steps, negative
    assert adv[0, 1, eos_early] < 0 and adv[0, 0, eos_complete] == 0.0
    np.testing.assert_allclose(adv[0, 1, 0], z[4] + z[5] + 2 * z[-1], rtol=1e-5)  # the first token: every step
