"""The user's own reward functions, named by import path, weighted with the built-ins.

    reward:
      functions:
        - {name: my_rewards:accuracy, weight: 1.0}             # a module on sys.path (the working directory first)
        - {name: rewards/code_reward.py:score, weight: 1.0}    # a file, relative to the working directory
        - {name: format, weight: 0.1}                           # a built-in

A function takes one of three forms, told apart by its first parameters' names (or set with
``options.form``), each a plain ``def`` or an ``async def``:

========== ========================================================== =====================================
form       signature                                                  called
========== ========================================================== =====================================
``sample`` ``fn(response, ground_truth, **row) -> float``             once per response
``batch``  ``fn(responses, rows) -> list[float]``                     once per batch (``options.batch_size``)
``trl``    ``fn(prompts, completions, **kwargs) -> list[float]``      as TRL calls its ``reward_funcs``
========== ========================================================== =====================================

``sample`` is recognised by a first parameter named ``response`` or ``completion``; ``batch`` by
``(responses, rows)``; ``trl`` by ``(prompts, completions)``. ``row`` holds every column of the
response's data row; ``rows[i]`` is that row plus ``ground_truth`` (the answer the run resolved from
it); TRL's keyword arguments are the columns as lists over the batch plus ``ground_truth``. Keyword
arguments a function does not declare (and it has no ``**kwargs``) are left out.

Every call runs in a :class:`~dapo_jax.rewards.pool.BoundedPool` (``options.max_workers`` at once,
``options.timeout_s`` each). A call that raises, times out, returns ``None``, a non-number or a
non-finite number, or a list of the wrong length, is a *failure*: its rows get ``wrong`` (the run's
``reward.wrong``, or ``options.wrong``) and count as incorrect, the pipeline counts them per function
(``reward_failures/NAME``), and the first failure's traceback is printed once per function. A row is
correct when its reward is above ``options.threshold`` (default 0).

A URL (``http://host:port/path``) names a remote reward (``rewards/remote.py``), run the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import inspect
import math
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from pathlib import Path
from typing import Any

import numpy as np

from dapo_jax.rewards.pool import BoundedPool, Outcome
from dapo_jax.rewards.remote import RemoteReward

__all__ = ["FORMS", "CustomReward", "CustomRewardError", "detect_form", "is_custom_name", "label", "load_function",
           "make_custom_reward"]

FORMS = ("sample", "batch", "trl")
OPTIONS = ("form", "timeout_s", "max_workers", "batch_size", "threshold", "wrong")
_FIRST_PARAMS = {("prompts", "completions"): "trl", ("responses", "rows"): "batch"}
_SAMPLE_FIRST = ("response", "completion")


class CustomRewardError(ValueError):
    """A user reward function that cannot be used as configured; the message is one line naming it."""


def is_custom_name(name: str) -> bool:
    """``module:function``, ``path/file.py:function`` or an ``http(s)://`` URL (not a built-in name)."""
    return ":" in name


def label(name: str) -> str:
    """A user reward's name in metrics (``reward_failures/LABEL``): ``file.py:fn`` without its folders,
    ``module:fn`` as is, a URL's host and path after ``remote:``."""
    if name.startswith(("http://", "https://")):
        return "remote:" + name.split("://", 1)[1]
    where, _, attr = name.rpartition(":")
    return f"{Path(where).name}:{attr}" if where.endswith(".py") else name


def load_function(spec: str, *, base: Path | None = None) -> Callable:
    """The callable ``spec`` names: ``package.module:function`` (imported from ``sys.path``, the
    working directory first) or ``path/to/file.py:function`` (relative to ``base``, else the working
    directory). Raises ``CustomRewardError`` naming what is missing."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr:
        raise CustomRewardError(f"{spec!r}: expected module:function or path/to/file.py:function")
    if where.endswith(".py"):
        path = Path(where)
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        if not path.is_file():
            raise CustomRewardError(f"{spec!r}: no such file {path}")
        mod_name = f"dapo_jax_user_reward_{hashlib.sha1(str(path.resolve()).encode()).hexdigest()[:12]}"
        module_spec = importlib.util.spec_from_file_location(mod_name, path)
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[mod_name] = module  # what dataclasses and pickle look a module's classes up in
        try:
            module_spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - the user's module: name the error in one line
            sys.modules.pop(mod_name, None)
            raise CustomRewardError(f"{spec!r}: importing {path} raised {type(e).__name__}: {e}") from e
    else:
        if str(Path.cwd()) not in sys.path and "" not in sys.path:
            sys.path.insert(0, str(Path.cwd()))
        try:
            module = importlib.import_module(where)
        except ModuleNotFoundError as e:
            raise CustomRewardError(f"{spec!r}: no module {e.name!r} (looked on sys.path, the working directory "
                                    f"first; a file is named path/to/file.py:function)") from e
        except Exception as e:  # noqa: BLE001
            raise CustomRewardError(f"{spec!r}: importing {where} raised {type(e).__name__}: {e}") from e
    fn = getattr(module, attr, None)
    if fn is None:
        raise CustomRewardError(f"{spec!r}: {where} has no attribute {attr!r}")
    if not callable(fn):
        raise CustomRewardError(f"{spec!r}: {attr} is a {type(fn).__name__}, not a function")
    return fn


def _positional_names(sig: inspect.Signature) -> list[str]:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in sig.parameters.values() if p.kind in kinds]


def detect_form(fn: Callable, *, name: str = "") -> str:
    """``sample``, ``batch`` or ``trl`` from the names of ``fn``'s first parameters (module docstring)."""
    sig = inspect.signature(fn)
    first = _positional_names(sig)
    form = _FIRST_PARAMS.get(tuple(first[:2]))
    if form is None and first and first[0] in _SAMPLE_FIRST:
        form = "sample"
    if form is None:
        raise CustomRewardError(f"{name!r}: cannot tell the form of {getattr(fn, '__name__', 'fn')}{sig}: name its "
                                f"first parameters (response, ground_truth), (responses, rows) or (prompts, "
                                f"completions), or set options.form to one of {FORMS}")
    return form


def _accepts(sig: inspect.Signature) -> tuple[bool, frozenset[str]]:
    """Whether ``sig`` takes ``**kwargs``, and the names it takes by keyword."""
    var_kw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values())
    named = frozenset(p.name for p in sig.parameters.values()
                      if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY))
    return var_kw, named


def _number(value) -> float | None:
    """``value`` as a finite float, or None (None, a string, a list, NaN, inf...)."""
    if isinstance(value, (bool, np.bool_)):
        return float(value)
    if isinstance(value, (Real, np.number)) and not isinstance(value, complex):
        f = float(value)
        return f if math.isfinite(f) else None
    return None


def _why_not_number(value) -> str:
    if value is None:
        return "returned None"
    if isinstance(value, (Real, np.number)):
        return f"returned {float(value)} (not finite)"
    return f"returned a {type(value).__name__} ({str(value)[:80]!r}), not a number"


@dataclasses.dataclass(eq=False)
class CustomReward:
    """A user function (module docstring) as the pipeline calls it: :meth:`score_rows` scores a batch;
    ``score``/``is_correct``/``__call__`` score one response with no row (the ``RewardFn`` protocol)."""

    name: str
    fn: Callable
    form: str
    wrong: float = 0.0
    threshold: float = 0.0
    timeout_s: float = 30.0
    max_workers: int = 8
    batch_size: int | None = None  # rows per call of a batch/trl function (None: the whole batch in one call)
    say: Callable[[str], None] = dataclasses.field(default=lambda msg: print(msg, file=sys.stderr, flush=True))

    def __post_init__(self):
        if self.form not in FORMS:
            raise CustomRewardError(f"{self.name!r}: options.form={self.form!r}; expected one of {FORMS}")
        if self.batch_size is not None and self.batch_size < 1:
            raise CustomRewardError(f"{self.name!r}: options.batch_size={self.batch_size} must be >= 1")
        try:
            self.pool = BoundedPool(self.max_workers, self.timeout_s)
        except ValueError as e:
            raise CustomRewardError(f"{self.name!r}: {e} (options.max_workers, options.timeout_s)") from e
        sig = inspect.signature(self.fn)
        self._var_kw, self._named = _accepts(sig)
        probe = {"sample": ("r", "t"), "batch": ([], []), "trl": ([], [])}[self.form]
        try:
            sig.bind_partial(*probe)  # the other parameters may be columns of the row: the dry call tells
        except TypeError as e:
            raise CustomRewardError(f"{self.name!r}: a {self.form!r} function is called as "
                                    f"{self._shape()}, and {getattr(self.fn, '__name__', 'fn')}{sig} cannot be ({e})"
                                    ) from e
        self._lock = threading.Lock()
        self._reported = False

    def _shape(self) -> str:
        return {"sample": "fn(response, ground_truth, **row)", "batch": "fn(responses, rows)",
                "trl": "fn(prompts, completions, **kwargs)"}[self.form]

    def _kwargs(self, columns: Mapping[str, Any], taken: tuple[str, ...]) -> dict:
        return {k: v for k, v in columns.items() if k not in taken and (self._var_kw or k in self._named)}

    def _calls(self, responses, truths, rows, prompts) -> list[tuple[list[int], Callable[[], Any]]]:
        """`(row indices, call)` pairs covering every row once."""
        n = len(responses)
        if self.form == "sample":
            return [([i], lambda i=i: self.fn(responses[i], truths[i],
                                              **self._kwargs(rows[i], ("response", "ground_truth"))))
                    for i in range(n)]
        size = self.batch_size or max(n, 1)
        calls = []
        for lo in range(0, n, size):
            idx = list(range(lo, min(lo + size, n)))
            full = [{**rows[i], "ground_truth": truths[i]} for i in idx]
            if self.form == "batch":
                calls.append((idx, lambda idx=idx, full=full: self.fn([responses[i] for i in idx], full)))
            else:
                columns = {k: [r.get(k) for r in full] for k in dict.fromkeys(k for r in full for k in r)}
                kwargs = self._kwargs(columns, ("prompts", "completions"))
                calls.append((idx, lambda idx=idx, kwargs=kwargs: self.fn([prompts[i] for i in idx],
                                                                           [responses[i] for i in idx], **kwargs)))
        return calls

    def score_rows(self, responses: Sequence[str], truths: Sequence[Any], *, rows: Sequence[Mapping] | None = None,
                   prompts: Sequence[str] | None = None) -> tuple[np.ndarray, dict[int, str]]:
        """Rewards ``[N]`` float32 (``wrong`` where a row failed) and ``{row: why}`` for the failed rows."""
        n = len(responses)
        rows = list(rows) if rows is not None else [{} for _ in range(n)]
        prompts = list(prompts) if prompts is not None else ["" for _ in range(n)]
        if len(rows) != n or len(prompts) != n or len(truths) != n:
            raise ValueError(f"reward {self.name!r}: {n} responses but {len(truths)} truths, {len(rows)} rows, "
                             f"{len(prompts)} prompts")
        rewards = np.full(n, self.wrong, np.float32)
        failed: dict[int, str] = {}
        calls = self._calls(responses, truths, rows, prompts)
        for (idx, _), outcome in zip(calls, self.pool.map([c for _, c in calls])):
            for i, (value, why) in zip(idx, self._values(outcome, len(idx))):
                if why is None:
                    rewards[i] = value
                else:
                    failed[i] = why
                    self._report(i, why, outcome, responses[i])
        return rewards, failed

    def _values(self, outcome: Outcome, k: int) -> list[tuple[float | None, str | None]]:
        """`(reward, None)` or `(None, why)` for each of the `k` rows of one call."""
        if outcome.error is not None:
            return [(None, outcome.brief)] * k
        if self.form == "sample":
            v = _number(outcome.value)
            return [(v, None if v is not None else _why_not_number(outcome.value))]
        values = outcome.value
        if isinstance(values, np.ndarray):
            values = values.tolist()
        if not isinstance(values, (list, tuple)):
            return [(None, f"returned a {type(values).__name__}, expected a list of {k} numbers")] * k
        if len(values) != k:
            return [(None, f"returned {len(values)} values for {k} responses")] * k
        return [(v, None) if (v := _number(x)) is not None else (None, _why_not_number(x)) for x in values]

    def _report(self, row: int, why: str, outcome: Outcome, response: str) -> None:
        with self._lock:
            if self._reported:
                return
            self._reported = True
        detail = outcome.error if outcome.error is not None and outcome.error != outcome.brief else why
        self.say(f"[dapo-jax] reward {self.name!r} failed on row {row} ({why}); scored {self.wrong:g} and counted "
                 f"in reward_failures/{self.name}; later failures of this function are counted, not printed. "
                 f"Response: {response[:200]!r}\n{detail.rstrip()}")

    # the RewardFn protocol: one response, no data row
    def score(self, response: str, ground_truth: Any) -> tuple[float, bool]:
        rewards, failed = self.score_rows([response], [ground_truth])
        if failed:
            raise RuntimeError(failed[0])
        return float(rewards[0]), bool(rewards[0] > self.threshold)

    def is_correct(self, response: str, ground_truth: Any) -> bool:
        return self.score(response, ground_truth)[1]

    def __call__(self, response: str, ground_truth: Any) -> float:
        return self.score(response, ground_truth)[0]

    def dry_run(self, response: str, ground_truth: Any, row: Mapping, prompt: str) -> None:
        """One call on one data row; raises ``CustomRewardError`` (one line) when it fails."""
        saved, self._reported = self._reported, True  # the dry run's failure is raised, not printed
        try:
            _, failed = self.score_rows([response], [ground_truth], rows=[row], prompts=[prompt])
        finally:
            self._reported = saved
        if failed:
            raise CustomRewardError(f"{self.name!r} ({self._shape()}): a dry call failed: {failed[0]}")


def make_custom_reward(name: str, options: Mapping[str, Any], *, wrong: float, base: Path | None = None,
                       say: Callable[[str], None] | None = None) -> CustomReward:
    """The reward ``name`` names (a URL: ``rewards/remote.py``), with ``options`` from OPTIONS; raises
    ``CustomRewardError`` (one line) for a name that cannot be imported or called so."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise CustomRewardError(f"{name!r}: unknown option(s) {unknown}; a user reward takes {list(OPTIONS)}")
    if name.startswith(("http://", "https://")):
        fn, form = RemoteReward(name, timeout_s=float(options.get("timeout_s", 30.0))), "trl"
        if options.get("form", "trl") != "trl":
            raise CustomRewardError(f"{name!r}: a remote reward is sent whole batches; leave options.form out")
    else:
        fn = load_function(name, base=base)
        form = options.get("form") or detect_form(fn, name=name)
    kwargs = {k: options[k] for k in ("timeout_s", "max_workers", "batch_size", "threshold") if k in options}
    extra = {"say": say} if say is not None else {}
    try:
        return CustomReward(name=label(name), fn=fn, form=form, wrong=float(options.get("wrong", wrong)),
                            **kwargs, **extra)
    except (TypeError, ValueError) as e:
        if isinstance(e, CustomRewardError):
            raise
        raise CustomRewardError(f"{name!r}: {e}") from e
