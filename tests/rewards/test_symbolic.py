"""The symbolic check: equalities, its time bound on pathological input, from worker threads."""

import logging
import math
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from dapo_jax.rewards import symbolic
from dapo_jax.rewards.symbolic import SymbolicTimeout, deadline, log2_magnitude_bound, math_verify_equal

PATHOLOGICAL = [
    "The answer is $2^{10^{10}}$",
    "$9^{9^{9^{9}}}$",
    "$(10^{7})!$",
    "$\\binom{10^{9}}{5 \\cdot 10^{8}}$",
]


@pytest.mark.parametrize(
    "response, truth",
    [
        ("$\\frac12$", "0.5"),
        ("\\boxed{\\dfrac{1}{2}}", "\\frac12"),
        ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),
        ("\\boxed{x^2 + 2x + 1}", "(x+1)^2"),
        ("$2^{100}$", "1267650600228229401496703205376"),
    ],
)
def test_equal(response, truth):
    assert math_verify_equal(response, truth)


@pytest.mark.parametrize(
    "response, truth",
    [
        ("\\boxed{0.33}", "\\frac13"),
        ("\\boxed{24}", "25"),
        ("", "25"),
        ("\\boxed{1}", ""),
        ("\\boxed{x+1}", "x+2"),
    ],
)
def test_not_equal(response, truth):
    assert not math_verify_equal(response, truth)


def _timed(fn, *args, **kwargs):
    start = time.monotonic()
    out = fn(*args, **kwargs)
    return out, time.monotonic() - start


@pytest.mark.parametrize("response", PATHOLOGICAL)
def test_pathological_input_is_refused_fast_in_main_thread(response):
    ok, seconds = _timed(math_verify_equal, response, "3", timeout_s=2.0)
    assert not ok and seconds < 5.0


def test_pathological_input_is_bounded_in_worker_threads():
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda r: _timed(math_verify_equal, r, "3", timeout_s=2.0), PATHOLOGICAL))
        good = pool.submit(math_verify_equal, "$\\frac12$", "0.5").result()
    assert all(not ok and seconds < 5.0 for ok, seconds in results), results
    assert good  # the check works from a worker thread (math-verify's own signal timeout would raise)


def test_main_thread_alarm_interrupts_a_big_integer_power_even_without_the_size_screen():
    # Only the deadline stands between SymPy and computing 2**(10**10): CPython's big-int pow
    # polls for signals, so the interval timer stops it.
    ok, seconds = _timed(math_verify_equal, "$2^{10^{10}}$", "3", timeout_s=0.5, max_bits=math.inf)
    assert not ok and seconds < 10.0


def test_length_cap():
    long_truth = "1" * 2000
    assert not math_verify_equal(f"\\boxed{{{long_truth}}}", long_truth, max_chars=1000)
    # Only the tail of a long response is read: the early box is out of reach.
    assert not math_verify_equal("\\boxed{5}" + " blah" * 400, "5", max_chars=100)


def _spin():
    def step(i):
        return i + 1

    i = 0
    while True:
        i = step(i)


def _catch_everything_except_base():
    try:
        _spin()
    except Exception:  # what math-verify and SymPy do internally
        return "swallowed"


@pytest.mark.parametrize("in_thread", [False, True])
def test_deadline_interrupts_python_code_and_is_not_swallowed(in_thread):
    out = {}

    def run():
        start = time.monotonic()
        try:
            with deadline(0.2):
                _catch_everything_except_base()
        except SymbolicTimeout:
            out["seconds"] = time.monotonic() - start
        out["tracer_after"] = sys.gettrace()

    if in_thread:
        t = threading.Thread(target=run)
        t.start()
        t.join(timeout=20)
        assert not t.is_alive()
    else:
        run()
    assert 0.15 < out["seconds"] < 5.0
    assert out["tracer_after"] is None or not in_thread


def test_deadline_restores_the_previous_alarm_handler_and_tracer():
    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGALRM, mine)
    try:
        with deadline(5.0):
            pass
        assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getitimer(signal.ITIMER_REAL)[0] == 0.0
    finally:
        signal.signal(signal.SIGALRM, previous)

    calls = []

    def outer_tracer(frame, event, arg):
        calls.append(event)

    def in_thread():
        sys.settrace(outer_tracer)
        with deadline(5.0):
            math.sqrt(4)

            def f():
                return 1

            f()
        restored = sys.gettrace() is outer_tracer
        sys.settrace(None)
        calls.append(restored)

    t = threading.Thread(target=in_thread)
    t.start()
    t.join()
    assert "call" in calls  # the existing tracer still saw calls (chained)
    assert calls[-1] is True


def test_magnitude_bound():
    import sympy

    two = sympy.Integer(2)
    assert log2_magnitude_bound(sympy.Integer(1000)) == 10
    tower = sympy.Pow(two, sympy.Pow(sympy.Integer(10), sympy.Integer(10), evaluate=False), evaluate=False)
    assert log2_magnitude_bound(tower) > 1e9
    # An upper bound, within a small factor for ordinary numbers (2**100 has 101 bits).
    assert 100 <= log2_magnitude_bound(sympy.Pow(two, sympy.Integer(100), evaluate=False)) <= 4 * 100
    assert log2_magnitude_bound(sympy.factorial(sympy.Integer(10**7), evaluate=False)) > 1e8
    x = sympy.Symbol("x")
    assert log2_magnitude_bound(x + 1) < 10


def test_a_fresh_process_first_check_is_not_charged_for_the_warm_up():
    # The first parse builds math-verify's grammar and the first comparison loads SymPy's
    # constants (about a second, several on a loaded machine). That cost is paid outside the
    # deadline, so a right first answer under a 0.25 s deadline is still right.
    code = (
        "from dapo_jax.rewards import symbolic\n"
        "ok = symbolic.math_verify_equal("
        "'\\\\boxed{(3, \\\\pi/2)}', '\\\\left( 3, \\\\frac{\\\\pi}{2} \\\\right)', timeout_s=0.25)\n"
        "print(ok, symbolic.timeouts())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "0"]


def test_a_check_past_its_deadline_is_counted_and_said(caplog, monkeypatch):
    math_verify_equal("\\boxed{1}", "1")  # warm: the next call's cost is only the check
    monkeypatch.setattr(symbolic, "_timeouts", 0)
    with caplog.at_level(logging.WARNING, logger="dapo_jax.rewards.symbolic"):
        assert not math_verify_equal("\\boxed{x^2 + 2x + 1}", "(x+1)^2", timeout_s=1e-6)
        assert symbolic.timeouts() == 1
        assert "past its 1e-06 s deadline 1 time(s)" in caplog.text  # said the first time
        caplog.clear()
        assert not math_verify_equal("\\boxed{x^2 + 2x + 1}", "(x+1)^2", timeout_s=1e-6)
    assert symbolic.timeouts() == 2
    assert "deadline" not in caplog.text  # then only every 100th
