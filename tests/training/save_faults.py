"""`python -m tests.training.save_faults MODE HOW CKPT_DIR KEEP dapo-jax-args...`: a training run whose
checkpoints folder fails the way a user meets it, once its first checkpoint is complete.

MODE: `readonly` (the folder becomes read-only: EROFS) or `full` (the device fills up: ENOSPC).
HOW:  `mount`, run inside `unshare -rm` (a user and mount namespace, no privilege needed where the
      kernel allows them): CKPT_DIR becomes a bind mount remounted read-only, or a small tmpfs that a
      filler file then fills; the run is a child process, so it sees the real errors of the real
      calls (Tensorstore's included). KEEP receives a copy of the folder before the namespace ends.
      `inject`, where no namespace can be made: the run is this process, and an audit hook makes
      every write under CKPT_DIR (open for writing, mkdir, rename) raise the OSError the file system
      would (the filesystem layer as Python sees it; Tensorstore's own writes are not audited).

Exits with the run's exit code.
"""

import errno
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

ERRORS = {"readonly": (errno.EROFS, "Read-only file system"), "full": (errno.ENOSPC, "No space left on device")}


def _first_checkpoint(ckpt: Path, proc=None) -> bool:
    """Waits until a checkpoint is complete (Orbax renames its temporary folder when done)."""
    while not (ckpt.is_dir() and any(p.name.isdigit() for p in ckpt.iterdir())):
        if proc is not None and proc.poll() is not None:
            return False
        time.sleep(0.05)
    return True


def _fill(ckpt: Path) -> None:
    """Writes until the device is full. The device may already be full (the run's own next save got
    there first): then even opening the filler fails, and that is the state wanted too."""
    block = b"\0" * (1 << 16)
    try:
        with open(ckpt / "filler", "wb") as f:
            while True:
                f.write(block)
                f.flush()
    except OSError:
        pass


def mount(mode: str, ckpt: Path, keep: Path, args: list[str]) -> int:
    ckpt.mkdir(parents=True, exist_ok=True)
    if mode == "full":  # a device with room for a few checkpoints of the tiny model
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(ckpt)], check=True)
    else:
        subprocess.run(["mount", "--bind", str(ckpt), str(ckpt)], check=True)
    proc = subprocess.Popen([sys.executable, "-m", "dapo_jax.cli", *args])
    if _first_checkpoint(ckpt, proc):
        if mode == "full":
            _fill(ckpt)
        else:
            _remount_read_only(ckpt)
    rc = proc.wait()
    if mode == "full":
        (ckpt / "filler").unlink(missing_ok=True)
    shutil.copytree(ckpt, keep, symlinks=True)
    return rc


def _remount_read_only(ckpt: Path, tries: int = 200) -> None:
    """`mount -o remount,ro,bind`, again every 10 ms while the kernel answers "busy" (exit 32): a file of
    the checkpoint just completed can still be open for writing for a moment (seen on a fast host)."""
    for _ in range(tries - 1):
        if subprocess.run(["mount", "-o", "remount,ro,bind", str(ckpt)], capture_output=True).returncode == 0:
            return
        time.sleep(0.01)
    subprocess.run(["mount", "-o", "remount,ro,bind", str(ckpt)], check=True)


def inject(mode: str, ckpt: Path, args: list[str]) -> int:
    code, text = ERRORS[mode]
    root = os.path.realpath(ckpt) + os.sep
    active = threading.Event()
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

    def hook(event: str, a: tuple) -> None:
        if not active.is_set() or not a or not isinstance(a[0], (str, bytes, os.PathLike)):
            return
        if event == "open":
            mode_, flags = a[1], a[2] or 0
            if not ((isinstance(mode_, str) and any(c in mode_ for c in "wax+")) or (mode_ is None and flags & writes)):
                return
        elif event not in ("os.mkdir", "os.rename", "os.replace", "os.remove", "os.rmdir", "shutil.rmtree"):
            return
        path = os.path.realpath(os.fsdecode(a[0]))
        if path.startswith(root):
            raise OSError(code, text, path)

    sys.addaudithook(hook)
    threading.Thread(target=lambda: _first_checkpoint(ckpt) and active.set(), daemon=True).start()
    from dapo_jax.cli import main as cli

    return cli(args)


def main() -> None:
    mode, how, ckpt, keep, args = sys.argv[1], sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]), sys.argv[5:]
    sys.exit(mount(mode, ckpt, keep, args) if how == "mount" else inject(mode, ckpt, args))


if __name__ == "__main__":
    main()
