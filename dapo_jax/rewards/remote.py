"""A reward served over HTTP: one POST of a JSON batch, one JSON list of rewards back.

    reward:
      functions:
        - {name: "http://127.0.0.1:8000/score", weight: 1.0, options: {timeout_s: 10, batch_size: 64}}

Request body (``Content-Type: application/json``), one entry per response, in order::

    {"prompts": [str], "responses": [str], "ground_truths": [...], "rows": [{column: value, ...}]}

Answer: ``{"rewards": [float, ...]}`` (or the bare list), as long as ``responses``. It is called as a
TRL-form function (``fn(prompts, completions, **columns)``) by
:class:`dapo_jax.rewards.custom.CustomReward`, so the same pool, timeouts and failure accounting apply: a connection error, an HTTP error status, a body that is not such a list, or
no answer within ``timeout_s`` fails the call's rows (scored ``wrong``, counted). Values that JSON cannot
carry (a date column) are sent as their ``str``.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

__all__ = ["RemoteReward"]


class RemoteReward:
    """``fn(prompts, completions, **columns) -> list[float]`` that POSTs the batch to ``url``."""

    def __init__(self, url: str, *, timeout_s: float = 30.0):
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"a remote reward's URL starts with http:// or https://, got {url!r}")
        self.url, self.timeout_s = url, float(timeout_s)
        self.__name__ = url

    def __call__(self, prompts, completions, **columns) -> list[float]:
        truths = columns.pop("ground_truth", [None] * len(completions))
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(completions))]
        body = {"prompts": list(prompts), "responses": list(completions), "ground_truths": list(truths), "rows": rows}
        data = json.dumps(body, default=str, allow_nan=False).encode()
        request = urllib.request.Request(self.url, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:
                payload = json.loads(answer.read().decode("utf-8"))
        except urllib.error.HTTPError as e:
            raise RuntimeError(f"{self.url} answered HTTP {e.code} {e.reason}") from None
        except urllib.error.URLError as e:
            raise RuntimeError(f"{self.url} unreachable: {e.reason}") from None
        except json.JSONDecodeError as e:
            raise RuntimeError(f"{self.url} answered something that is not JSON ({e.msg})") from None
        rewards = payload.get("rewards") if isinstance(payload, dict) else payload
        if not isinstance(rewards, list):
            raise RuntimeError(f"{self.url} answered {str(payload)[:120]!r}; expected {{\"rewards\": [...]}}")
        return rewards
