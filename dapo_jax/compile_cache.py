"""JAX's persistent compilation cache for `dapo-jax train` and `dapo-jax eval`.

A run compiles its rollout, update and evaluation programs before its first step: on the main job about
50 s of a 2-core CPU's time, and minutes for a large model on an accelerator. A resumed run (after a
preemption, a crash or `kill`) or a rerun compiles the very same programs again. With the cache, XLA's
executables are read back from disk instead (docs/benchmarks.md, "The persistent compilation cache").

Where it lives, first match wins:
- `JAX_COMPILATION_CACHE_DIR` set: JAX's own setting, left as it is (the tests use it);
- `DAPO_JAX_COMPILATION_CACHE` set: that folder, or no cache when it is empty, `0`, `off` or `none`;
- else `$XDG_CACHE_HOME/dapo_jax/xla` (default `~/.cache/dapo_jax/xla`).

Nothing here can change a result: the cache key is the program's HLO with the compiler's options and
versions, so a changed program, flag or jax version compiles afresh. An entry that cannot be read
(a truncated or corrupted file) makes JAX warn and compile instead. The folder is kept under
`MAX_BYTES` by evicting the least recently used entries.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

ENV = "DAPO_JAX_COMPILATION_CACHE"
OFF = ("", "0", "off", "none", "false")
MAX_BYTES = 2 << 30  # LRU eviction above 2 GiB (JAX's `jax_compilation_cache_max_size`)


def cache_dir(environ=os.environ) -> Path | None:
    """The folder this process should cache in, or None (off, or JAX's own variable decides)."""
    if environ.get("JAX_COMPILATION_CACHE_DIR"):
        return None
    if ENV in environ:
        value = environ[ENV].strip()
        return None if value.lower() in OFF else Path(value).expanduser()
    base = environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base).expanduser() / "dapo_jax" / "xla"


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
    return path
