"""Answer extraction from decoded responses (host-side string code, never evaluated as code).

Every extractor returns the answer's raw text, or ``None`` when the response has no answer of that
form, so that "no answer" is never confused with an empty answer that happens to match.

- :func:`extract_dapo_answer`: DAPO / verl ``math_dapo``: the last ``Answer:`` match within the last
  300 characters of the response (DAPO's prompt asks for a final line ``Answer: $Answer``).
- :func:`extract_boxed`: the content of the last ``\\boxed{...}`` (balanced braces; ``\\fbox`` and
  the brace-less ``\\boxed 5`` too).
- :func:`extract_gsm8k`: GSM8K's ``#### N`` (the dataset's own answer format).
- :func:`extract_last_number`: the last number in the text (verl's "flexible" GSM8K mode).
- :func:`extract_final_answer`: whichever of the last box and the last ``Answer:`` comes later.
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
]

# verl math_dapo: "The longest answer in MATH-500 has 273 characters", so 300 is enough and bounds
# the regex work on long responses.
DAPO_TAIL_CHARS = 300

_ANSWER_RE = re.compile(r"(?i)Answer\s*:\s*([^\n]+)")
# A number: optional sign, digits with optional thousands separators, optional decimals.
_NUMBER_RE = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|[-+]?\.\d+")
_GSM8K_RE = re.compile(r"####\s*\$?\s*([-+]?[0-9][0-9.,]*)")


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


def extract_final_answer(response: str, *, tail_chars: int = DAPO_TAIL_CHARS) -> str | None:
    """The answer stated last: the last ``\\boxed{}`` or the last ``Answer:`` line, whichever
    starts later in the response (a model may box a draft and then write ``Answer:``, or the
    reverse); ``None`` when neither is there."""
    boxed = extract_boxed(response)
    answer = extract_dapo_answer(response, tail_chars=tail_chars)
    if boxed is None or answer is None:
        return boxed if answer is None else answer
    box_at = _boxed_start(response)[0]
    tail_start = max(len(response) - tail_chars, 0) if tail_chars > 0 else 0
    answer_at = tail_start + [m.start() for m in _ANSWER_RE.finditer(response[tail_start:])][-1]
    return answer if answer_at > box_at else boxed
