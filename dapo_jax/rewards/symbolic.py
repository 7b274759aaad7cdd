"""Symbolic answer check with ``math-verify``, bounded in time, safe from any thread.

math-verify parses LaTeX into SymPy (never ``eval``), then compares numerically and
symbolically (``\\frac12`` == ``0.5`` == ``\\dfrac{1}{2}``). Its own timeout uses
``signal.alarm``, which only works in the main thread and raises ``ValueError`` elsewhere (e.g.
in a reward worker pool). So this module turns math-verify's signal timeouts off
(``parsing_timeout=None``, ``timeout_seconds=None``) and bounds the work itself, in any thread:

1. a length cap: only the last ``max_chars`` characters of the response are parsed, and a gold
   answer longer than that is refused;
2. a size screen on the parsed (still unevaluated) SymPy trees: a numeric power tower or factorial
   whose value would exceed ``max_bits`` bits (``2^{10^{10}}``, ``(10^6)!``) is refused before
   SymPy tries to evaluate it. This matters because such a number is built by one C call
   (CPython's big-integer ``pow``) that a trace hook cannot interrupt;
3. a deadline: in the main thread a ``SIGALRM`` interval timer (CPython's big-int loops poll for
   signals, so this interrupts them too); in any other thread a per-thread trace hook
   (``sys.settrace`` affects only the calling thread) raising at the first Python call past the
   deadline. :class:`SymbolicTimeout` derives from ``BaseException`` so that the
   ``except Exception`` clauses inside math-verify / SymPy cannot swallow it. A timeout counts as
   "not equal".

Limits: in a worker thread, one long C call that the size screen misses still runs to its end. A
debugger/coverage tracer already installed is chained, not replaced.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import signal
import sys
import threading
import time

__all__ = [
    "SymbolicTimeout",
    "deadline",
    "log2_magnitude_bound",
    "math_verify_equal",
    "parse_gold",
    "parse_prediction",
    "timeouts",
]

DEFAULT_TIMEOUT_S = 3.0
DEFAULT_MAX_CHARS = 1000
DEFAULT_MAX_BITS = 100_000  # about 30,000 decimal digits: SymPy handles that in milliseconds

# math-verify's one-off start-up is paid on these pairs, outside any deadline (`_math_verify`): they touch
# the grammar, fractions, roots, constants, tuples and plain expressions
_WARM_UP = (
    ("\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "\\boxed{(3, \\pi/2)}"),
    ("\\boxed{2\\sqrt{2}}", "\\boxed{\\sqrt{8}}"),
    ("\\boxed{0.5}", "x = 1/2"),
)

_log = logging.getLogger(__name__)
_timeouts = 0  # checks in this process that ran past their deadline (see timeouts())


class SymbolicTimeout(BaseException):
    """The symbolic check ran past its deadline.

    A ``BaseException`` so that ``except Exception`` inside math-verify / SymPy cannot swallow it.
    """


@contextlib.contextmanager
def deadline(seconds: float):
    """Raise :class:`SymbolicTimeout` in this thread once ``seconds`` have passed.

    Main thread: ``signal.setitimer(ITIMER_REAL)`` (the previous handler and timer are restored).
    Other threads: a trace hook checked at every Python function call.
    """
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        with _signal_deadline(seconds):
            yield
    else:
        with _trace_deadline(seconds):
            yield


@contextlib.contextmanager
def _signal_deadline(seconds: float):
    def handler(signum, frame):
        raise SymbolicTimeout(f"symbolic check exceeded {seconds} s")

    old_handler = signal.signal(signal.SIGALRM, handler)
    old_delay, old_interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_handler)
        if old_delay > 0:  # someone else's timer was running: give it back
            signal.setitimer(signal.ITIMER_REAL, old_delay, old_interval)


@contextlib.contextmanager
def _trace_deadline(seconds: float):
    end = time.monotonic() + seconds
    previous = sys.gettrace()

    def tracer(frame, event, arg):
        if time.monotonic() > end:
            raise SymbolicTimeout(f"symbolic check exceeded {seconds} s")
        # Only 'call' events are needed; chain a pre-existing tracer (coverage, debugger).
        return previous(frame, event, arg) if previous is not None else None

    sys.settrace(tracer)
    try:
        yield
    finally:
        sys.settrace(previous)


@functools.cache
def _math_verify():
    # Imported lazily: math-verify pulls in SymPy (about a second), needed only by this check.
    import math_verify
    from math_verify import ExprExtractionConfig, LatexExtractionConfig

    # math-verify warns once that its signal timeout is off; this module supplies the deadline.
    class _DropTimeoutDisabled(logging.Filter):
        def filter(self, record):
            return "Timeout is disabled" not in record.getMessage()

    for name in ("math_verify.parser", "math_verify.grader"):
        logging.getLogger(name).addFilter(_DropTimeoutDisabled())
    configs = (LatexExtractionConfig(), ExprExtractionConfig())
    # Warm up outside any deadline: the first parse builds math-verify's LaTeX grammar and the
    # first comparison loads SymPy's constants and simplifiers (about a second on a quiet core,
    # several on a loaded one). Charged to a user's first answer, that cost once ran past the
    # deadline and scored a right answer as wrong.
    for gold, pred in _WARM_UP:
        math_verify.verify(
            math_verify.parse(gold, extraction_config=configs, parsing_timeout=None),
            math_verify.parse(pred, extraction_config=configs, parsing_timeout=None),
            timeout_seconds=None,
        )
    return math_verify, configs



def parse_gold(gold: str):
    """math-verify's parse of a ground truth, wrapped in ``\\boxed{}`` as verl does.

    No deadline of its own: call it under :func:`deadline`.
    """
    math_verify, configs = _math_verify()
    text = gold if "\\boxed" in gold else f"\\boxed{{{gold}}}"
    return math_verify.parse(text, extraction_config=configs, parsing_timeout=None)


def parse_prediction(response: str):
    """math-verify's parse of a response (LaTeX first, then plain expressions; no deadline)."""
    math_verify, configs = _math_verify()
    return math_verify.parse(response, extraction_config=configs, parsing_timeout=None)


def log2_magnitude_bound(expr) -> float:
    """An upper bound on ``log2 |value|`` of a numeric SymPy tree, without evaluating it.

    Integers and rationals give their bit length; ``Add`` the largest term plus the carry bits;
    ``Mul`` the sum; ``Pow(b, e)`` ``|e| * bound(b)`` (``|e|`` itself bounded by ``2**bound(e)``,
    so towers are caught); ``factorial(n)``/``binomial(n, k)`` ``n log2 n``. Other functions give
    the largest bound of their arguments (``sin``, ``log`` shrink values, but a huge argument
    would still be built). Symbols and constants count as small.
    """
    import sympy

    if isinstance(expr, sympy.Rational):  # Integer included
        return float(max(abs(int(expr.p)).bit_length(), int(expr.q).bit_length()))
    if isinstance(expr, sympy.Float):
        value = abs(float(expr))
        return math.log2(value) if value > 1 else 0.0
    if not isinstance(expr, sympy.Basic) or not expr.args:
        return 0.0
    children = [log2_magnitude_bound(a) for a in expr.args]
    if isinstance(expr, sympy.Pow):
        base, exponent = children
        # |exponent| <= 2**bound(exponent); 2**1100 overflows float: anything that large is huge.
        exp_value = 2.0 ** exponent if exponent < 1000 else math.inf
        return max(base, 1.0) * exp_value
    if isinstance(expr, (sympy.factorial, sympy.binomial, sympy.factorial2)):
        n = 2.0 ** children[0] if children[0] < 1000 else math.inf
        return n * math.log2(max(n, 2.0))
    if isinstance(expr, sympy.Add):
        return max(children) + math.log2(len(children)) + 1.0
    if isinstance(expr, sympy.Mul):
        return sum(children)
    return max(children)


def _too_big(parsed, max_bits: float) -> bool:
    return any(
        not isinstance(item, str) and log2_magnitude_bound(item) > max_bits for item in parsed
    )


def math_verify_equal(
    response: str,
    ground_truth: str,
    *,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_chars: int = DEFAULT_MAX_CHARS,
    max_bits: float = DEFAULT_MAX_BITS,
) -> bool:
    """Whether ``response``'s final answer equals ``ground_truth`` symbolically (math-verify).

    Args:
      response: decoded response; only its last ``max_chars`` characters are parsed (math-verify
        looks for the last ``\\boxed{}``, then ``final answer is``, then the last LaTeX/expression).
      ground_truth: LaTeX answer (e.g. MATH-500's ``\\frac{14}{3}``), parsed as ``\\boxed{gt}``.
      timeout_s: wall-clock bound for parsing both sides and comparing them.
      max_chars: length cap on the parsed text.
      max_bits: refuse (return False) when a parsed number would exceed this many bits.

    Returns:
      True when math-verify finds them equal; False when not, when either side does not parse,
      or when the deadline passes.
    """
    if not response or not str(ground_truth).strip():
        return False
    ground_truth = str(ground_truth)
    if len(ground_truth) > max_chars:
        return False
    math_verify, _ = _math_verify()
    try:
        with deadline(timeout_s):
            gold = parse_gold(ground_truth)
            pred = parse_prediction(response[-max_chars:])
            if not gold or not pred or _too_big(gold, max_bits) or _too_big(pred, max_bits):
                return False
            return bool(math_verify.verify(gold, pred, timeout_seconds=None))
    except SymbolicTimeout:
        global _timeouts
        _timeouts += 1
        if _timeouts == 1 or _timeouts % 100 == 0:
            _log.warning(
                "math-verify ran past its %g s deadline %d time(s) in this process: each scored "
                "as not equal (raise timeout_s if right answers are being refused)",
                timeout_s,
                _timeouts,
            )
        return False


def timeouts() -> int:
    """How many checks in this process ran past their deadline, each scored as not equal."""
    return _timeouts
