"""DeepSeek-R1's language-consistency reward: the share of the chain of thought written in the target language.

R1 (DeepSeek-AI, 2025, §2.3.3) adds to the accuracy reward "the proportion of target language words in
the CoT", against the mixing of languages its R1-Zero showed. Here::

    r = (# words of the CoT in the target script) / (# words of the CoT)

The CoT is the text inside ``<think>...</think>`` when the response has one, else the whole response.
A *word* is a run of letters (digits, symbols and LaTeX commands' backslashes are not words); a run of
CJK ideographs or kana counts each character as one word, as Chinese and Japanese are written without
spaces. A word is in the target language when all its letters are in its script: ``en`` (Latin
letters), ``zh`` (CJK ideographs), ``ja`` (kana and CJK ideographs), ``ru`` (Cyrillic). A CoT with no
word at all scores ``empty`` (default 0: nothing was written in the target language).
"""

from __future__ import annotations

import dataclasses
import re
import unicodedata
from typing import Any

__all__ = ["LANGUAGES", "LanguageReward", "language_share", "words"]

_CJK = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_KANA = "\u3040-\u309f\u30a0-\u30ff"
_WORD_RE = re.compile(rf"[{_CJK}{_KANA}]|[^\W\d_{_CJK}{_KANA}]+")
_THINK_RE = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)


def _latin(ch: str) -> bool:
    return "LATIN" in unicodedata.name(ch, "")


def _cyrillic(ch: str) -> bool:
    return "CYRILLIC" in unicodedata.name(ch, "")


def _in(ranges: str):
    pattern = re.compile(f"[{ranges}]")
    return lambda ch: pattern.fullmatch(ch) is not None


LANGUAGES = {"en": _latin, "zh": _in(_CJK), "ja": _in(_CJK + _KANA), "ru": _cyrillic}


def words(text: str) -> list[str]:
    """The words of ``text`` (module docstring): letter runs, each CJK or kana character alone."""
    return _WORD_RE.findall(text)


def language_share(text: str, language: str, *, empty: float = 0.0) -> float:
    """The share of ``text``'s words whose letters are all in ``language``'s script."""
    in_script = LANGUAGES[language]
    found = words(text)
    if not found:
        return float(empty)
    return sum(all(in_script(ch) for ch in w) for w in found) / len(found)


@dataclasses.dataclass(frozen=True)
class LanguageReward:
    """``r`` of the module docstring on the response's CoT; ``is_correct``: every word in the target language."""

    language: str = "en"
    empty: float = 0.0
    name: str = "language"

    def __post_init__(self):
        if self.language not in LANGUAGES:
            raise ValueError(f"language: language={self.language!r}; known: {sorted(LANGUAGES)}")

    @property
    def wrong(self) -> float:
        return 0.0

    @staticmethod
    def chain_of_thought(response: str) -> str:
        found = _THINK_RE.search(response)
        return found.group(1) if found else response

    def score(self, response: str, ground_truth: Any = None) -> tuple[float, bool]:
        share = language_share(self.chain_of_thought(response), self.language, empty=self.empty)
        return share, share >= 1.0

    def is_correct(self, response: str, ground_truth: Any = None) -> bool:
        return self.score(response)[1]

    def __call__(self, response: str, ground_truth: Any = None) -> float:
        return self.score(response)[0]
