"""The chain-of-thought task: lengths in the promised range, arithmetic of every trace variant checked
independently, deterministic disjoint splits, knobs validated with errors that name them."""

import re

import numpy as np
import pytest

from dapo_jax.data import cot

_STEP = re.compile(r"([a-z]?\d+(?:\+[a-z]\d+)+)=(\d+)")


def parse_trace(text: str) -> tuple[list[tuple[str, list[int], int]], list[int], int | None]:
    """(step lines as (labels of the added terms, operands, stated result), restated `Total:`
    values, final answer)."""
    steps, totals, answer = [], [], None
    for line in text.split("\n"):
        if m := _STEP.fullmatch(line):
            parts = m.group(1).split("+")
            labels = "".join(p[0] for p in parts[1:])
            steps.append((labels, [int(p.lstrip("abcdefghijklmnopqrstuvwxyz")) for p in parts], int(m.group(2))))
        elif m := re.fullmatch(r"Total: (\d+)", line):
            totals.append(int(m.group(1)))
        elif m := re.fullmatch(r"Answer: (\d+)", line):
            answer = int(m.group(1))
        else:
            raise AssertionError(f"unexpected trace line {line!r} in {text!r}")
    return steps, totals, answer


def recheck(prompt: str, text: str) -> int:
    """Number of arithmetic slips in `text`, recomputed from scratch; asserts the chain's bookkeeping
    (each line starts from the previous result, adds the prompt's terms in order under their labels,
    the trace ends with the last result as its Answer)."""
    labelled = {p[0]: int(p[1:]) for p in prompt[:-1].split("+")}
    steps, totals, answer = parse_trace(text)
    assert text.startswith(f"a{labelled['a']}+b"), text  # the first line starts from term a
    used, acc, slips = "a", labelled["a"], 0
    for labels, operands, result in steps:
        assert operands[0] == acc, (prompt, text)
        assert operands[1:] == [labelled[c] for c in labels], (prompt, text)
        used += labels
        slips += sum(operands) != result
        acc = result
    assert used == "".join(labelled), (prompt, text)
    assert answer == acc, (prompt, text)
    assert totals in ([], [r for _, _, r in steps])
    return slips


ROWS = cot.cot_rows("train", train_size=3000) + cot.cot_rows("heldout")


def test_rows_are_sums_and_reference_traces_are_right():
    for row in ROWS:
        assert int(row["answer"]) == sum(cot.parse_prompt(row["prompt"]))
        text = cot.solution(row["prompt"])
        assert recheck(row["prompt"], text) == 0
        assert cot.is_correct(text, row["answer"])


@pytest.mark.parametrize("variant, slips", [("reference", 0), ("verbose", 0), ("terse", 0), ("slip", 1)])
def test_variants_arithmetic(variant, slips):
    for i, row in enumerate(ROWS[:600]):
        text = cot.trace(row["prompt"], variant, seed=i)
        assert recheck(row["prompt"], text) == slips
        assert cot.is_correct(text, row["answer"]) == (slips == 0)


def test_variant_shapes():
    prompt = "a12+b7+c45+d3+e9="
    assert cot.make_prompt([12, 7, 45, 3, 9]) == prompt
    assert cot.solution(prompt) == "a12+b7=19\n19+c45=64\n64+d3=67\n67+e9=76\nAnswer: 76"
    assert cot.trace(prompt, "verbose") == ("a12+b7=19\nTotal: 19\n19+c45=64\nTotal: 64\n64+d3=67\n"
                                            "Total: 67\n67+e9=76\nTotal: 76\nAnswer: 76")
    assert cot.trace(prompt, "terse") == "a12+b7+c45=64\n64+d3+e9=76\nAnswer: 76"
    assert cot.trace("a1+b2+c3+d4=", "terse") == "a1+b2+c3=6\n6+d4=10\nAnswer: 10"
    slipped = [cot.trace(prompt, "slip", seed=s) for s in range(20)]
    assert len(set(slipped)) > 3  # the seed moves the slip
    assert all(not cot.is_correct(t, "76") for t in slipped)
    assert cot.trace("a0+b0=", "slip", seed=0) in ("a0+b0=1\nAnswer: 1", "a0+b0=10\nAnswer: 10")  # never < 0


def test_default_lengths_span_10_to_150_tokens():
    """One token per character (the char tokenizer) plus EOS."""
    lengths = np.array([len(cot.solution(r["prompt"])) + 1 for r in ROWS])
    assert 10 <= lengths.min() <= 20 and 130 <= lengths.max() <= 150  # 18 and 137 here (139 over the full splits)
    assert np.percentile(lengths, 25) <= 50 and np.percentile(lengths, 90) >= 110  # spread, not a spike
    verbose = np.array([len(cot.trace(r["prompt"], "verbose")) + 1 for r in ROWS])
    terse = np.array([len(cot.trace(r["prompt"], "terse")) + 1 for r in ROWS])
    assert (verbose >= lengths).all() and verbose.mean() > 1.5 * lengths.mean()
    assert (terse <= lengths).all() and terse.mean() < 0.8 * lengths.mean()
    assert max(len(r["prompt"]) for r in ROWS) <= 48  # the cot configs' data.max_prompt_length


def test_knobs_change_the_problems():
    rows = cot.cot_rows("heldout", heldout_size=200, min_terms=3, max_terms=4, min_digits=2, max_digits=3)
    for row in rows:
        terms = cot.parse_prompt(row["prompt"])
        assert 3 <= len(terms) <= 4 and all(10 <= t <= 999 for t in terms)
    counts = {k: sum(len(cot.parse_prompt(r["prompt"])) == k for r in rows) for k in (3, 4)}
    assert min(counts.values()) > 60  # number of terms roughly uniform


def test_splits_deterministic_disjoint_and_seeded():
    a, b = cot.cot_rows("heldout", seed=3), cot.cot_rows("heldout", seed=3)
    assert a == b and len(a) == 400 and len({r["prompt"] for r in a}) == 400
    train = cot.cot_rows("train", seed=3, train_size=5000)
    assert train == cot.cot_rows("train", seed=3, train_size=5000)
    assert len({r["prompt"] for r in train}) == 5000
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in a}
    assert cot.cot_rows("heldout", seed=4) != a
    # a larger request extends the same draw order
    assert cot.cot_rows("heldout", seed=3, heldout_size=500)[:400] == a
    # pinned: the draws are sha512-based, so they never change across NumPy/Python versions
    assert cot.cot_rows("heldout", seed=0)[:2] == PINNED_HELDOUT


PINNED_HELDOUT = [{"prompt": "a9+b3+c5+d8+e4+f7+g2=", "answer": "38"},
                  {"prompt": "a8+b0+c2+d0+e0+f7=", "answer": "17"}]


@pytest.mark.parametrize("kwargs, word", [
    (dict(split="test"), "split"),
    (dict(min_terms=1), "min_terms"),
    (dict(min_terms=5, max_terms=4), "max_terms"),
    (dict(max_terms=cot.MAX_TERMS + 1), "max_terms"),
    (dict(min_digits=0), "min_digits"),
    (dict(min_digits=3, max_digits=2), "max_digits"),
    (dict(max_digits=cot.MAX_DIGITS + 1), "max_digits"),
    (dict(heldout_size=0), "heldout_size"),
    (dict(train_size=-1), "train_size"),
    (dict(min_terms=2, max_terms=2, max_digits=1, heldout_size=101), "too small"),  # 100 exist
])
def test_bad_knobs_raise_naming_them(kwargs, word):
    with pytest.raises(ValueError, match=word):
        cot.cot_rows(**{"split": "heldout", **kwargs})


def test_parse_prompt_and_bad_inputs():
    assert cot.parse_prompt("a3+b40+c5=") == [3, 40, 5]
    for bad in ("a3+b4", "a3=", "a3+b-4=", "3+4=", "a3+c4=", "b3+a4=", "a+b=", ""):
        with pytest.raises(ValueError, match="cot prompt"):
            cot.parse_prompt(bad)
    with pytest.raises(ValueError, match="variant"):
        cot.trace("a3+b4=", "sloppy")


def test_is_correct_reads_the_last_line_only():
    assert cot.is_correct("a3+b4=7\nAnswer: 7", "7")
    assert cot.is_correct("a3+b4=7\nAnswer: 7\n\n", 7)
    assert cot.is_correct("Answer: 007", "7")
    assert cot.extract_answer("x\nAnswer:  007 ") == "7"
    assert not cot.is_correct("a3+b4=7\nAnswer: 8", "7")
    assert not cot.is_correct("a3+b4=7\nAnswer: 7\n7+c1=8", "7")  # kept writing after its answer
    assert not cot.is_correct("a3+b4=7\nAnswer: 7 apples", "7")
    assert not cot.is_correct("a3+b4=7", "7")  # unfinished: no Answer line
    assert not cot.is_correct("a3+b4=7\nAnsw", "7")  # truncated mid-line
    assert not cot.is_correct("", "7")
    assert cot.extract_answer("a3+b4=7") is None
