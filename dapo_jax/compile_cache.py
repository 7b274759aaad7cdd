"""JAX's persistent compilation cache for `dapo-jax train` and `dapo-jax eval`.

A run compiles its rollout, update and evaluation programs before its first step: on the main job about
50 s of a 2-core CPU's time, and minutes for a large model on an accelerator. A resumed run (after a
preemption, a crash or `kill`) or a rerun compiles the very same programs again. With the cache, XLA's
executables are read back from disk instead (docs/benchmarks.md, "The persistent compilation cache").

Where it lives, first match wins:
- `JAX_COMPILATION_CACHE_DIR` set: JAX's own setting, left as it is (the tests use it);
- `DAPO_JAX_COMPILATION_CACHE` set: that folder, or no cache when it is empty, `0`, `off` or `none`;
- else `$XDG_CACHE_HOME/dapo_jax/xla` (default `~/.cache/dapo_jax/xla`).
In the last two, entries go in a subfolder named after the host's CPU (`host_tag`). XLA compiles CPU
programs for the host's instruction set, and JAX's cache key names only the platform ("cpu"). A home
folder shared by machines with different CPUs (NFS on a cluster) would otherwise hand one machine
another's executable.

Nothing here can change a result: the cache key is the program's HLO with the compiler's options and
versions, so a changed program, flag or jax version compiles afresh. An entry that cannot be read
(a truncated or corrupted file) makes JAX warn and compile instead. The folder is kept under
`MAX_BYTES` by evicting the least recently used entries. Every program is kept, not only those that
took JAX's default 1 s to compile (unless `JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS` says otherwise).
"""

from __future__ import annotations

import hashlib
import os
import platform
import warnings
from pathlib import Path

ENV = "DAPO_JAX_COMPILATION_CACHE"
OFF = ("", "0", "off", "none", "false")
MAX_BYTES = 2 << 30  # LRU eviction above 2 GiB (JAX's `jax_compilation_cache_max_size`)


def host_tag(cpuinfo: str | None = None) -> str:
    """`MACHINE-HASH`: the architecture and a hash of the CPU's feature flags (Linux `/proc/cpuinfo`)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace")
        except OSError:
            cpuinfo = platform.processor()
    flags = sorted({line for line in cpuinfo.splitlines() if line.split(":")[0].strip() in ("flags", "Features")})
    machine = platform.machine() or "unknown"
    return f"{machine}-{hashlib.sha256(' '.join([machine, *flags]).encode()).hexdigest()[:12]}"


def cache_dir(environ=os.environ) -> Path | None:
    """The folder this process should cache in, or None (off, or JAX's own variable decides)."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    if ENV in environ:
        value = environ[ENV].strip()
        return None if value.lower() in OFF else Path(value).expanduser() / host_tag()
    base = environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "dapo_jax" / "xla" / host_tag()


def enable_compilation_cache(environ=os.environ) -> Path | None:
    """Points JAX's persistent compilation cache at `cache_dir()`; returns the folder (None: not set here).

    Call before the first compilation. A folder that cannot be created (a read-only home) only warns:
    the run goes on without the cache."""
    path = cache_dir(environ)
    if path is None:
        return None
    try:
        path.mkdir(parents=True, exist_ok=True)
        if not os.access(path, os.W_OK):
            raise PermissionError(f"{path} is not writable")
    except OSError as e:
        warnings.warn(f"compilation cache off: cannot use {path} ({e}); set {ENV} to another folder or to 'off'",
                      RuntimeWarning, stacklevel=2)
        return None
    import jax

    jax.config.update("jax_compilation_cache_dir", str(path))
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES)
    if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in environ:
        # every program, not only those over JAX's default 1 s: the main job's 44 smaller ones took 6 s
        # to compile, and a warm three-step job ran 3 s faster with them cached (docs/benchmarks.md)
        jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return path
