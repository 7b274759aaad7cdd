"""Answer extraction from decoded responses (host-side string code, never evaluated as code).

Every extractor returns the answer's raw text, or ``None`` when the response has no answer of that
form, so that "no answer" is never confused with an empty answer that happens to match.

- :func:`extract_dapo_answer`: DAPO / verl ``math_dapo``: the last ``Answer:`` match within the last
  300 characters of the response (DAPO's prompt asks for a final line ``Answer: $Answer``).
- :func:`extract_boxed`: the content of the last ``\\boxed{...}`` (balanced braces; ``\\fbox`` and
  the brace-less ``\\boxed 5`` too).
- :func:`extract_gsm8k`: GSM8K's ``#### N`` (the dataset's own answer format).
- :func:`extract_last_number`: the last number in the text (verl's "flexible" GSM8K mode).
- :func:`extract_answer_tag`: R1's ``<answer>...</answer>`` (the last closed one; a box inside it is
  unboxed).
- :func:`extract_final_answer`: whichever of the last box, the last ``Answer:`` and the last
  ``<answer>`` tag comes later.

The checks read R1's tag wherever they read an answer: when the last ``<answer>...</answer>`` starts
after the marker a check looks for (``Answer:``, ``\\boxed{}``, ``####``), the answer is the tag's
(:func:`latest_answer`).
"""

from __future__ import annotations

import re

__all__ = [
    "DAPO_TAIL_CHARS",
    "extract_dapo_answer",
    "extract_boxed",
    "extract_gsm8k",
    "extract_last_number",
    "extract_final_answer",
    "extract_answer_tag",
    "latest_answer",
]

# verl math_dapo: "The longest answer in MATH-500 has 273 characters", so 300 is enough and bounds
# the regex work on long responses.
DAPO_TAIL_CHARS = 300

_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# A number: optional sign, digits with optional thousands separators, optional decimals.
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_GSM8K_RE = re.compile(r"####\s*\$?\s*([-+]?[0-9][0-9.,]*)")
_TAG_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)


def extract_dapo_answer(response: str, *, tail_chars: int = DAPO_TAIL_CHARS) -> str | None:
    """The text after the last ``Answer:`` (case-insensitive) in the last ``tail_chars`` characters.

    Mirrors verl's ``math_dapo.is_correct_minerva``: ``re.findall(r"(?i)Answer\\s*:\\s*([^\\n]+)",
    response[-300:])[-1]``. ``\\s*`` may cross a newline, so ``"Answer:\\n25"`` reads ``25`` (as in
    verl); an ``Answer:`` with nothing after it is no answer (``None``).
    """
    tail = response[-tail_chars:] if tail_chars > 0 else response
    matches = _ANSWER_RE.findall(tail)
    if not matches:
        return None
    answer = matches[-1].strip()
    return answer or None


def _boxed_start(text: str) -> tuple[int, str] | None:
    """Index and command of the last ``\\boxed`` / ``\\fbox``."""
    best = None
    for command in ("\\boxed", "\\fbox"):
        idx = text.rfind(command)
        if idx >= 0 and (best is None or idx > best[0]):
            best = (idx, command)
    return best


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), matching braces; else ``None``.

    ``\\boxed{\\frac{1}{2}}`` -> ``\\frac{1}{2}``; ``\\boxed 5`` -> ``5`` (TeX's brace-less form, up
    to the next ``$`` or whitespace). An unclosed box (a truncated response) is no answer.
    """
    found = _boxed_start(text)
    if found is None:
        return None
    idx, command = found
    rest = text[idx + len(command):]
    if rest.startswith(" "):  # "\boxed 5$": one token up to "$" / whitespace
        token = rest.lstrip(" ").split("$")[0].split()
        return token[0] if token else None
    if not rest.startswith("{"):
        return None
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                content = rest[1:i].strip()
                return content or None
    return None


def extract_gsm8k(text: str) -> str | None:
    """The number after the last ``####`` (GSM8K's answer line), commas and ``$`` removed."""
    matches = _GSM8K_RE.findall(text)
    if not matches:
        return None
    answer = matches[-1].rstrip(".,").replace(",", "")
    return answer or None


def extract_last_number(text: str) -> str | None:
    """The last number in ``text`` (thousands separators removed), or ``None``."""
    matches = _NUMBER_RE.findall(text)
    if not matches:
        return None
    return matches[-1].replace(",", "")


def _answer_tag(response: str) -> tuple[int, str] | None:
    """Start and text of the last closed ``<answer>...</answer>`` (a box inside it unboxed)."""
    matches = list(_TAG_RE.finditer(response))
    if not matches:
        return None
    inner = matches[-1].group(1)
    text = extract_boxed(inner) if _boxed_start(inner) is not None else inner.strip()
    return (matches[-1].start(), text) if text else None


def extract_answer_tag(response: str) -> str | None:
    """R1's answer: the text of the last closed ``<answer>...</answer>``, stripped; a ``\\boxed{}``
    inside it gives its content. An unclosed tag (a truncated response) or an empty one is no answer."""
    found = _answer_tag(response)
    return None if found is None else found[1]


def latest_answer(response: str, found: str | None, found_at: int) -> str | None:
    """``found`` (an answer a check's own extractor read at index ``found_at``; ``-1`` for none), or
    the ``<answer>`` tag's text when the tag starts later."""
    tag = _answer_tag(response)
    if tag is not None and (found is None or tag[0] > found_at):
        return tag[1]
    return found


def _answer_line_at(response: str, tail_chars: int) -> int:
    """Index of the last ``Answer:`` match in the tail (``-1``: none)."""
    tail_start = max(len(response) - tail_chars, 0) if tail_chars > 0 else 0
    starts = [m.start() for m in _ANSWER_RE.finditer(response[tail_start:])]
    return tail_start + starts[-1] if starts else -1


def extract_final_answer(response: str, *, tail_chars: int = DAPO_TAIL_CHARS) -> str | None:
    """The answer stated last: the last ``\\boxed{}``, the last ``Answer:`` line or the last
    ``<answer>`` tag, whichever starts later in the response (a model may box a draft and then write
    ``Answer:``, or the reverse); ``None`` when none is there."""
    boxed = extract_boxed(response)
    answer = extract_dapo_answer(response, tail_chars=tail_chars)
    found = [(_boxed_start(response)[0], boxed) if boxed is not None else None,
             (_answer_line_at(response, tail_chars), answer) if answer is not None else None]
    found = [f for f in found if f is not None]
    at, text = max(found, key=lambda f: f[0]) if found else (-1, None)
    return latest_answer(response, text, at)
