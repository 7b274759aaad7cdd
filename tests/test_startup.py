"""dapo_jax/startup.py: what the CLI sets up before its heavy imports: writes to a closed terminal that do
not end the run, and libtpu kept quiet on a host without a TPU. (Signals while starting: the CLI's tests in
tests/training/test_faults.py send real ones.)"""

import io
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from dapo_jax import startup

REPO = Path(__file__).resolve().parents[1]


def test_a_write_to_a_closed_terminal_is_dropped_and_the_descriptor_goes_to_devnull():
    master, slave = pty.openpty()
    raw = io.TextIOWrapper(io.FileIO(slave, "w", closefd=True), line_buffering=True)
    stream = startup._TerminalStream(raw)
    stream.write("shown\n")
    assert os.read(master, 100) == b"shown\r\n"
    os.close(master)  # the terminal closes: the next write fails with EIO underneath
    with pytest.raises(OSError):
        os.write(slave, b"x")
    assert stream.write("lost\n") == 5 and stream.flush() is None
    assert os.path.samefile(f"/proc/self/fd/{slave}", os.devnull)
    raw.close()


def test_an_other_write_error_still_raises():
    class Full(io.StringIO):
        def write(self, text):
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space"):
        startup._TerminalStream(Full()).write("x")


def jax_start(env, *, prepared: bool = True) -> tuple[bool, str]:
    """Starts JAX's backends in a fresh process: (whether libtpu was loaded into it, its stderr)."""
    setup = "from dapo_jax import startup; startup.prepare(); " if prepared else ""
    code = f"{setup}import jax; jax.devices(); print('libtpu' in open('/proc/self/maps').read())"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip() == "True", done.stderr


@pytest.mark.skipif(startup.tpu_visible() or not startup.importlib.util.find_spec("libtpu")
                    or any(startup.importlib.util.find_spec(m) for m in startup.GPU_PLUGINS),
                    reason="needs libtpu installed on a host without a TPU or GPU plugin (where it would speak)")
def test_libtpu_is_never_started_on_a_cpu_host():
    """libtpu's start-up failures come and go (five lines on some starts, none on others), so the test asserts
    the cause: after `prepare` JAX never loads libtpu, which JAX alone does."""
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    assert jax_start(env) == (False, "")
    assert jax_start(env, prepared=False)[0]
