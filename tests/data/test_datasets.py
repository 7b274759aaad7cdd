"""Dataset loading and per-format field mapping, on the real files under ../shared/data (skipped when absent)."""

import json

import pytest

from dapo_jax.data.datasets import FORMATS, DataError, DatasetFormat, Problem, load_problems, register_format, to_problems


def test_gsm8k_answer_after_hashes(shared):
    problems = load_problems(shared("data", "gsm8k", "test.jsonl"), format="gsm8k")
    assert len(problems) == 1319
    assert problems[0].problem.startswith("Janet\u2019s ducks lay 16 eggs per day.")
    assert [p.answer for p in problems[:3]] == ["18", "3", "70000"]
    assert [p.index for p in problems[:3]] == [0, 1, 2]


def test_math500_keeps_latex_answers(shared):
    problems = load_problems(shared("data", "math500", "test.jsonl"), format="math500")
    assert len(problems) == 500
    assert problems[0].problem.startswith("Convert the point $(0,3)$")
    assert [p.answer for p in problems[:3]] == ["\\left( 3, \\frac{\\pi}{2} \\right)", "p - q", "\\frac{14}{3}"]


def test_aime_answers_are_integer_strings(shared):
    a24 = load_problems(shared("data", "aime2024", "test.jsonl"), format="aime")
    a25 = load_problems(shared("data", "aime2025", "test.jsonl"), format="aime")
    assert (len(a24), len(a25)) == (30, 30)
    assert [p.answer for p in a24[:3]] == ["204", "113", "371"]
    assert [p.answer for p in a25[:3]] == ["70", "588", "16"]
    assert a25[0].problem.startswith("Find the sum of all integer bases $b>9$")


def test_amc_float_answers(shared):
    problems = load_problems(shared("data", "amc23", "test.jsonl"), format="amc")
    assert [p.answer for p in problems[:3]] == ["27", "36", "45"]


def test_dapo_math_parquet_problem_from_chat_messages(shared):
    problems = load_problems(shared("data", "dapo_math_17k", "dapo_math_17k.parquet"), format="dapo_math")
    assert len(problems) == 17917
    assert [p.answer for p in problems[:3]] == ["34", "113", "-3"]
    assert problems[0].problem.startswith("In triangle $ABC$, $\\sin \\angle A = \\frac{4}{5}$")
    assert problems[2].problem.startswith("Let $a, b, c$ be distinct numbers")


def test_synthetic_source():
    problems = load_problems("synthetic", format="synthetic", split="heldout")
    assert len(problems) == 400
    p = problems[0]
    a, op, b = p.problem[:2], p.problem[2], p.problem[3:4]
    assert int(p.answer) == (int(a) + int(b) if op == "+" else int(a) - int(b))


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_missing_field_names_file_row_and_field(tmp_path):
    path = _write_jsonl(tmp_path / "bad.jsonl", [
        {"question": "1+1?", "answer": "#### 2"},
        {"question": "2+2?", "answer": "#### 4"},
        {"question": "", "answer": "#### 6"},
    ])
    with pytest.raises(DataError, match=r"bad\.jsonl: row 2 has no problem field 'question'"):
        load_problems(path, format="gsm8k")


def test_missing_key_in_a_row_and_bad_answer(tmp_path):
    path = _write_jsonl(tmp_path / "rows.jsonl", [{"problem": "x", "answer": "3"}, {"problem": "y"}])
    with pytest.raises(DataError, match=r"rows\.jsonl: row 1 has no answer field 'answer'"):
        load_problems(path, format="math500")
    path = _write_jsonl(tmp_path / "aime.jsonl", [{"problem": "x", "answer": "3"}, {"problem": "y", "answer": "2.5"}])
    with pytest.raises(DataError, match=r"aime\.jsonl: row 1, field 'answer' is not an integer"):
        load_problems(path, format="aime")
    path = _write_jsonl(tmp_path / "g.jsonl", [{"question": "x", "answer": "no marker"}])
    with pytest.raises(DataError, match=r"row 0, field 'answer' has no '####'"):
        load_problems(path, format="gsm8k")


def test_custom_fields_and_dotted_paths(tmp_path):
    path = _write_jsonl(tmp_path / "c.jsonl", [{"q": "what?", "meta": {"gt": "7"}}])
    assert load_problems(path, format="custom", problem_field="q", answer_field="meta.gt") == [Problem("what?", "7", 0)]
    with pytest.raises(DataError, match=r"no problem field: name it \(data.train.prompt_field / data.eval.prompt_field in a run config, --prompt-field"):
        load_problems(path, format="custom")
    # an override on a named format
    assert to_problems([{"question": "a", "final": "5"}], "math500", problem_field="question",
                       answer_field="final") == [Problem("a", "5", 0)]


def test_parquet_and_saved_dataset_directory(tmp_path):
    import datasets

    ds = datasets.Dataset.from_list([{"problem": "p0", "answer": "1"}, {"problem": "p1", "answer": "2"}])
    ds.to_parquet(str(tmp_path / "d.parquet"))
    assert [p.answer for p in load_problems(tmp_path / "d.parquet", format="math500")] == ["1", "2"]
    datasets.DatasetDict({"test": ds}).save_to_disk(str(tmp_path / "saved"))
    assert [p.problem for p in load_problems(tmp_path / "saved", format="math500", split="test")] == ["p0", "p1"]
    with pytest.raises(DataError, match="no split 'train'"):
        load_problems(tmp_path / "saved", format="math500", split="train")


def test_unknown_format_and_missing_file(tmp_path):
    with pytest.raises(DataError, match="unknown dataset format 'nope'"):
        to_problems([], "nope")
    with pytest.raises(DataError, match="no such file"):
        load_problems(tmp_path / "absent.jsonl", format="gsm8k")


def test_register_format():
    name = "test_only_format"
    register_format(name, DatasetFormat("x", "y"))
    try:
        assert to_problems([{"x": "a", "y": "b"}], name) == [Problem("a", "b", 0)]
        with pytest.raises(ValueError, match="already registered"):
            register_format(name, DatasetFormat("x", "y"))
    finally:
        FORMATS.pop(name)


def test_a_byte_that_is_not_utf8_names_the_file_line_and_column(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_bytes(b'{"question": "1+1=", "answer": "#### 2"}\n{"question": "caf\xe9?", "answer": "#### 3"}\n')
    with pytest.raises(DataError) as info:
        load_problems(str(path), format="gsm8k")
    assert str(info.value) == f"{path}: line 2, column 18: byte 0xe9 is not UTF-8 (save the file as UTF-8)"


def test_a_named_pipe_is_read_like_a_file(tmp_path):
    """`data.train=<(zcat rows.jsonl.gz)` in a shell gives a pipe: its rows are read like a file's."""
    import os
    import threading

    fifo = tmp_path / "rows.jsonl"
    os.mkfifo(fifo)
    writer = threading.Thread(target=lambda: fifo.write_text('{"question": "2+2=", "answer": "#### 4"}\n'))
    writer.start()
    problems = load_problems(str(fifo), format="gsm8k")
    writer.join()
    assert [(p.problem, p.answer) for p in problems] == [("2+2=", "4")]
