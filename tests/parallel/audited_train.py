"""`python -m tests.parallel.audited_train RECORD RUN_DIR dapo-jax-args...`: the CLI, recording in
RECORD every file this process opens for writing, creates, renames or removes under RUN_DIR (Python's
audit hooks), so a test can check what each process of a multi-process run wrote.

With `AUDITED_TRAIN_SIGKILL_AT=PREFIX` in its environment, the process sends itself SIGKILL at its first
recorded write under RUN_DIR/PREFIX (e.g. `checkpoints/3.orbax-checkpoint-tmp`: inside the save of
checkpoint 3, while the other processes take part in it): a real kill -9 at a known point.

Every process writes the programs it compiles to the persistent compilation cache (`cache_from_every_process`):
JAX writes only from process 0, and process 1's programs have keys of their own on the CPU, so without this
each of the test's five process pairs would compile all of process 1's programs afresh."""

import os
import signal
import sys


def cache_from_every_process() -> None:
    """Lets this process write its compiled programs to JAX's persistent cache, as process 0 does: JAX's
    compiler module sees process id 0 (everything else of the distributed state is the real one). Only the
    cache write reads it on this backend. A JAX without those internals is left as it is."""
    from jax._src import compiler, distributed

    real = distributed.global_state
    if not hasattr(compiler, "distributed") or not hasattr(real, "process_id"):
        return

    class AsProcess0:
        def __getattr__(self, name):
            return 0 if name == "process_id" else getattr(real, name)

    class Distributed:
        def __getattr__(self, name):
            return AsProcess0() if name == "global_state" else getattr(distributed, name)

    compiler.distributed = Distributed()


def main() -> None:
    record, run_dir, args = sys.argv[1], os.path.realpath(sys.argv[2]), sys.argv[3:]
    out = open(record, "a", buffering=1)  # line by line: a SIGKILLed process keeps what it recorded
    writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
    kill_at = os.environ.get("AUDITED_TRAIN_SIGKILL_AT")

    def write(line: str, rel: str) -> None:
        out.write(line)
        if kill_at and rel.startswith(kill_at):
            out.flush()
            os.kill(os.getpid(), signal.SIGKILL)

    def under(path) -> str | None:
        try:
            p = os.path.realpath(os.fsdecode(path))
        except (TypeError, ValueError):
            return None
        return os.path.relpath(p, run_dir) if p == run_dir or p.startswith(run_dir + os.sep) else None

    def hook(event: str, a: tuple) -> None:
        if event == "open" and isinstance(a[0], (str, bytes, os.PathLike)):
            mode, flags = a[1], a[2] or 0
            if (isinstance(mode, str) and any(c in mode for c in "wax+")) or (mode is None and flags & writes):
                rel = under(a[0])
                if rel is not None:
                    write(f"open {rel}\n", rel)
        elif event in ("os.mkdir", "os.rename", "os.remove", "os.rmdir", "os.truncate", "shutil.rmtree"):
            rel = under(a[0])
            if rel is not None:
                write(f"{event} {rel}\n", rel)

    sys.addaudithook(hook)
    cache_from_every_process()
    from dapo_jax.cli import main as cli

    sys.exit(cli(args))


if __name__ == "__main__":
    main()
