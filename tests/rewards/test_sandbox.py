"""The sandbox contains hostile programs: each attack gets a clear verdict and leaves the host untouched."""

import logging
import os
import signal
import socket
import threading

import pytest

from dapo_jax.rewards.sandbox import STATUSES, Sandbox, SandboxLimits, SandboxResult, SandboxUnavailable


def _sandbox(mode: str, **limits) -> Sandbox:
    try:
        return Sandbox(SandboxLimits(**{"wall_s": 20.0, "cpu_s": 5, "memory_mb": 256, **limits}),
                       max_concurrent=2, mode=mode)
    except SandboxUnavailable as e:
        pytest.skip(f"no {mode} sandbox on this machine: {e}")


@pytest.fixture(scope="module")
def box() -> Sandbox:
    return _sandbox("bwrap")


def test_a_program_that_runs_to_its_end_passes_with_its_output(box):
    r = box.run("import math\nprint(math.factorial(5))\nimport sys; print('err', file=sys.stderr)")
    assert r == SandboxResult("passed", 0, "120\n", "err\n", r.wall_s, "bwrap")
    assert r.passed and box.mode == "bwrap"


@pytest.mark.parametrize("source, shows", [
    ("raise ValueError('boom')", "ValueError: boom"),
    ("import sys; sys.exit(0)", "SystemExit: 0"),  # HumanEval counts it failed too
    ("import os; os._exit(0)", ""),  # exit code 0 but never reached its end: no pass token
    ("def f(:\n  pass", "SyntaxError"),
])
def test_a_program_that_does_not_reach_its_end_fails(box, source, shows):
    r = box.run(source)
    assert r.status == "failed" and not r.passed
    assert shows in r.stderr


def test_infinite_loop_is_killed_at_the_wall_limit():
    r = _sandbox("bwrap", wall_s=1.5).run("while True:\n    pass")
    assert (r.status, r.returncode) == ("timeout", None)


def test_cpu_limit_kills_a_busy_loop_before_the_wall():
    r = _sandbox("bwrap", cpu_s=1, wall_s=120.0).run("while True:\n    pass")
    assert r.status == "failed"
    assert r.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)


def test_fork_bomb_forks_nothing(box):
    src = ("import os\nn = 0\nwhile True:\n    try:\n        os.fork()\n    except OSError as e:\n"
           "        print(n, e.errno)\n        break\n    n += 1\n")
    r = box.run(src)
    assert r.passed and r.stdout == "0 11\n"  # the very first fork is refused with EAGAIN
    assert box.run("import subprocess\nsubprocess.run(['true'])").status == "failed"
    assert box.run("import os\nwhile True:\n    os.fork()").status == "failed"


def test_threads_still_work(box):
    src = ("import threading\nout = []\nts = [threading.Thread(target=out.append, args=(i,)) for i in range(4)]\n"
           "[t.start() for t in ts]\n[t.join() for t in ts]\nprint(sorted(out))")
    assert box.run(src).stdout == "[0, 1, 2, 3]\n"


def test_memory_bomb_fails_inside(box):
    r = box.run("x = bytearray(2 << 30)")
    assert r.status == "failed" and "MemoryError" in r.stderr


def test_only_the_scratch_folder_is_writable_and_the_host_is_invisible(box, tmp_path):
    target = tmp_path / "escaped.txt"
    r = box.run(f"open({str(target)!r}, 'w').write('x')")
    assert r.status == "failed" and not target.exists()
    assert box.run(f"import os\nprint(os.listdir({str(tmp_path)!r}))").status == "failed"  # not even visible
    for folder in ("/usr", "/", "/dev", "/dev/shm"):  # read-only binds, bwrap's root and /dev remounted read-only
        assert box.run(f"open('{folder.rstrip('/')}/escaped.txt', 'w')").status == "failed", folder
    assert box.run("open('/dev/null', 'w').write('x')").passed  # devices still work
    marker = f"dapo_sandbox_scratch_{os.getpid()}.txt"
    r = box.run(f"open('/tmp/{marker}', 'w').write('kept')\nprint(open('/tmp/{marker}').read())")
    assert r.passed and r.stdout == "kept\n"
    assert not os.path.exists(f"/tmp/{marker}")  # the scratch tmpfs is the sandbox's own


def test_scratch_is_size_limited():
    r = _sandbox("bwrap", scratch_mb=1).run("open('/tmp/big', 'wb').write(b'x' * (4 << 20))")
    assert r.status == "failed"


def test_no_network_not_even_the_hosts_loopback(box):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.setblocking(False)
    port = server.getsockname()[1]
    try:
        r = box.run(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)")
        assert r.status == "failed" and ("ConnectionRefusedError" in r.stderr or "OSError" in r.stderr)
        with pytest.raises(BlockingIOError):
            server.accept()  # nothing ever reached the host's listener
    finally:
        server.close()
    assert box.run("import socket\nsocket.getaddrinfo('example.com', 80)").status == "failed"


def test_signals_cannot_reach_the_trainer(box):
    received = []
    previous = signal.signal(signal.SIGUSR1, lambda *_: received.append(1))
    try:
        r = box.run(f"import os, signal\nos.kill({os.getpid()}, signal.SIGUSR1)")
        assert r.status == "failed" and "ProcessLookupError" in r.stderr  # the host's PIDs do not exist inside
        box.run("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)")  # its own parent, inside
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert received == []
    assert box.run("print('still here')").stdout == "still here\n"


def test_huge_stdout_is_cut_at_the_cap():
    r = _sandbox("bwrap", output_bytes=10_000).run("import sys\nwhile True:\n    sys.stdout.write('x' * 4096)")
    assert r.status == "output_limit" and r.returncode is None
    assert 0 < len(r.stdout) <= 10_000


def test_run_many_keeps_order_and_bounds_concurrency():
    box = _sandbox("bwrap")
    active, peak, lock = [0], [0], threading.Lock()
    run_once = box._run_once

    def counted(source, mode):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        try:
            return run_once(source, mode)
        finally:
            with lock:
                active[0] -= 1

    box._run_once = counted
    results = box.run_many([f"print({i})" for i in range(6)])
    assert [r.stdout for r in results] == [f"{i}\n" for i in range(6)]
    assert 1 <= peak[0] <= box.max_concurrent == 2


def test_fallback_says_it_is_one_and_still_blocks_network_and_forks(caplog):
    with caplog.at_level(logging.WARNING, logger="dapo_jax.rewards.sandbox"):
        box = _sandbox("fallback")
    assert box.mode == "fallback"
    assert any("FALLBACK" in rec.getMessage() and "NOT confined" in rec.getMessage() for rec in caplog.records)
    r = box.run("print(1)")
    assert (r.status, r.mode) == ("passed", "fallback")
    assert box.run("import socket\nsocket.create_connection(('127.0.0.1', 22), timeout=2)").status == "failed"
    assert box.run("import os\nos.fork()").status == "failed"


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="wall_s"):
        SandboxLimits(wall_s=0)
    with pytest.raises(ValueError, match="mode"):
        Sandbox(mode="docker")
    assert set(STATUSES) == {"passed", "failed", "timeout", "output_limit"}
