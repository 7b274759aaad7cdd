"""Problems with verifiable answers, read through the `datasets` library and mapped per dataset.

    problems = load_problems("../shared/data/gsm8k/test.jsonl", format="gsm8k")
    problems = load_problems("dapo_math_17k.parquet", format="dapo_math")
    problems = load_problems("synthetic", format="synthetic", split="heldout")
    problems = load_problems("my.jsonl", format="custom", problem_field="q", answer_field="a")

A ``source`` is a ``.jsonl``/``.json`` file, a ``.parquet`` file, a directory (written by
``Dataset.save_to_disk``, or holding data files), the word ``synthetic``, or a Hugging Face hub name
such as ``openai/gsm8k`` (passed to ``datasets.load_dataset(name, config, split=split)``; needs the
network or a warm cache, so it is documented but not tested offline).

A ``format`` names how a row maps to ``(problem, answer)``:

| format | problem | answer |
|---|---|---|
| ``gsm8k`` | ``question`` | the text after the last ``####`` of ``answer`` (commas dropped) |
| ``math500`` | ``problem`` | ``answer`` (a LaTeX string, kept as is) |
| ``dapo_math`` | the last user message of ``prompt`` (verl's chat-message list) | ``reward_model.ground_truth`` |
| ``aime`` | ``problem`` | ``answer`` as an integer string (``"025"`` -> ``"25"``) |
| ``amc`` | ``problem`` | ``answer`` (``27.0`` -> ``"27"``) |
| ``synthetic`` | ``prompt`` | ``answer`` |
| ``custom`` | ``problem_field=`` | ``answer_field=`` |

Field names are dotted paths (``reward_model.ground_truth``) and can be overridden for every format.
A row whose field is missing or empty raises ``DataError`` naming the source, the row index and the field.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, Callable

from dapo_jax.data import synthetic


class DataError(ValueError):
    """A dataset row or source this project cannot use; the message names the file, row and field."""


@dataclasses.dataclass(frozen=True)
class Problem:
    """One problem: its bare statement, the ground-truth answer string, and its row in the source.

    ``row`` is the source row itself (every column), which user reward functions receive
    (``rewards/custom.py``); it takes no part in equality."""

    problem: str
    answer: str
    index: int
    row: dict | None = dataclasses.field(default=None, compare=False, repr=False)


# ----------------------------------------------------------------------------- answer extractors
def _plain(value: Any) -> str:
    return str(value).strip()


def _gsm8k_answer(value: Any) -> str:
    text = str(value)
    if "####" not in text:
        raise ValueError("has no '####' final-answer marker")
    return text.rsplit("####", 1)[1].strip().replace(",", "")


def _integer_answer(value: Any) -> str:
    number = float(str(value).strip())
    if not number.is_integer():
        raise ValueError(f"is not an integer: {value!r}")
    return str(int(number))


def _number_answer(value: Any) -> str:
    number = float(str(value).strip())
    return str(int(number)) if number.is_integer() else repr(number)


def _last_user_message(value: Any) -> str:
    if isinstance(value, str):
        return value
    users = [m for m in value if isinstance(m, dict) and m.get("role") == "user"]
    if not users:
        raise ValueError("holds no message with role 'user'")
    return users[-1]["content"]


@dataclasses.dataclass(frozen=True)
class DatasetFormat:
    """How one dataset's rows map to a ``Problem``: field paths and value converters."""

    problem_field: str | None
    answer_field: str | None
    problem_fn: Callable[[Any], str] = _plain
    answer_fn: Callable[[Any], str] = _plain


FORMATS: dict[str, DatasetFormat] = {
    "gsm8k": DatasetFormat("question", "answer", answer_fn=_gsm8k_answer),
    "math500": DatasetFormat("problem", "answer"),
    "dapo_math": DatasetFormat("prompt", "reward_model.ground_truth", problem_fn=_last_user_message),
    "aime": DatasetFormat("problem", "answer", answer_fn=_integer_answer),
    "amc": DatasetFormat("problem", "answer", answer_fn=_number_answer),
    "synthetic": DatasetFormat("prompt", "answer"),
    "custom": DatasetFormat(None, None),
}


def register_format(name: str, fmt: DatasetFormat) -> None:
    """Adds a dataset format by name (raises if the name is taken)."""
    if name in FORMATS:
        raise ValueError(f"dataset format {name!r} is already registered")
    FORMATS[name] = fmt


# ----------------------------------------------------------------------------- loading
def load_rows(source: str | Path, *, split: str = "train", config: str | None = None) -> list[dict]:
    """The raw rows of a source (see the module docstring for what a source may be)."""
    import datasets

    src = str(source)
    path = Path(src)
    if src == "synthetic":
        return synthetic.synthetic_rows("heldout" if split == "test" else split)
    if path.exists() and not path.is_dir():  # a file, or a pipe (`<(zcat rows.jsonl.gz)`, a FIFO)
        kind = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}.get(path.suffix)
        if kind is None:
            raise DataError(f"{path}: unknown data file type {path.suffix!r} (expected .jsonl, .json, .parquet, .csv)")
        if kind == "json":
            return _read_json_rows(path)
        try:
            ds = datasets.load_dataset(kind, data_files=str(path), split="train")
        except Exception as e:  # noqa: BLE001 - the library's errors do not name the file
            raise DataError(f"{path}: cannot be read as {path.suffix[1:]}: {type(e).__name__}: {e}") from e
        if len(ds) == 0:
            raise DataError(f"{path}: the file holds no rows")
    elif path.is_dir():
        if (path / "dataset_info.json").exists() or (path / "dataset_dict.json").exists():
            ds = datasets.load_from_disk(str(path))
            if isinstance(ds, datasets.DatasetDict):
                if split not in ds:
                    raise DataError(f"{path}: no split {split!r}; it has {sorted(ds)}")
                ds = ds[split]
        else:
            ds = datasets.load_dataset(str(path), split=split)
    elif path.suffix in (".jsonl", ".json", ".parquet", ".csv") or src.startswith((".", "/")):
        raise DataError(f"{path}: no such file or directory")
    else:
        ds = datasets.load_dataset(src, config, split=split)  # a hub name
    return ds.to_list()


def _read_json_rows(path: Path) -> list[dict]:
    """Rows of a ``.jsonl`` file (one object per line) or a ``.json`` file (a list of objects, or JSON
    lines); a bad line raises ``DataError`` naming the file and the line, an empty file says so."""
    raw = path.read_bytes()
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw.count(b"\n", 0, e.start) + 1
        column = e.start - (raw.rfind(b"\n", 0, e.start) + 1) + 1
        raise DataError(f"{path}: line {line}, column {column}: byte 0x{raw[e.start]:02x} is not UTF-8 (save the file "
                        f"as UTF-8)") from None
    if path.suffix == ".json" and text.lstrip().startswith("["):
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    else:
        rows = []
        for lineno, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise DataError(f"{path}: line {lineno} is not valid JSON ({e.msg}, column {e.colno})") from None
    if not rows:
        raise DataError(f"{path}: the file holds no rows")
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise DataError(f"{path}: row {i} is a {type(row).__name__}, expected a JSON object")
    return rows


def _get(row: dict, dotted: str):
    value = row
    for key in dotted.split("."):
        if not isinstance(value, dict) or value.get(key) is None:
            return None
        value = value[key]
    return value


def to_problems(rows: list[dict], fmt: str | DatasetFormat, *, source: str = "<rows>",
                problem_field: str | None = None, answer_field: str | None = None) -> list[Problem]:
    """Maps raw rows to ``Problem``s; a missing/empty/unparsable field names the source, row and field."""
    if isinstance(fmt, str):
        if fmt not in FORMATS:
            raise DataError(f"unknown dataset format {fmt!r}; registered: {sorted(FORMATS)}")
        fmt = FORMATS[fmt]
    fields = {"problem": problem_field or fmt.problem_field, "answer": answer_field or fmt.answer_field}
    for role, name in fields.items():
        if name is None:
            key = "prompt_field" if role == "problem" else "answer_field"
            raise DataError(f"{source}: no {role} field: name it (data.train.{key} / data.eval.{key} in a run "
                            f"config, --{key.replace('_', '-')} for `dapo-jax eval --data`)")
    convert = {"problem": fmt.problem_fn, "answer": fmt.answer_fn}
    problems = []
    for i, row in enumerate(rows):
        out = {}
        for role, name in fields.items():
            value = _get(row, name)
            if value is None or (isinstance(value, str) and not value.strip()):
                raise DataError(f"{source}: row {i} has no {role} field {name!r} (row keys: {sorted(row)})")
            try:
                out[role] = convert[role](value)
            except (ValueError, TypeError, KeyError) as e:
                raise DataError(f"{source}: row {i}, field {name!r} {e}") from e
        problems.append(Problem(problem=out["problem"], answer=out["answer"], index=i, row=row))
    return problems


def load_problems(source: str | Path, *, format: str, split: str = "train", config: str | None = None,
                  problem_field: str | None = None, answer_field: str | None = None) -> list[Problem]:
    """Loads a source and maps its rows with the named ``format`` (field names overridable)."""
    rows = load_rows(source, split=split, config=config)
    return to_problems(rows, format, source=str(source), problem_field=problem_field, answer_field=answer_field)
