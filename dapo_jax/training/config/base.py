"""What every section of a run config shares: the frozen base model that refuses unknown keys, and the
errors that name the bad key.

A section's validator raises `KeyedError(key, msg)`; `run.config_from_dict` turns it into one
`ConfigError` line, `FILE: section.key: msg`, the form every config error takes.
"""

from __future__ import annotations

import difflib

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """A configuration that cannot run; the message names the key and the file."""


class KeyedError(ValueError):
    """A validator's error about `key` (dotted, relative to the section that raised it)."""

    def __init__(self, key: str, msg: str):
        super().__init__(f"{key}: {msg}")
        self.key, self.msg = key, msg


class Section(BaseModel):
    # inf/NaN are never a valid setting (`optim.lr=.inf` would NaN every parameter): refuse them here.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def did_you_mean(word: str, choices) -> str:
    """` (did you mean 'x'?)` for the closest of `choices`, or '' when none is close."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""
