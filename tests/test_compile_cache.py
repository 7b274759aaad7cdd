"""The CLI's persistent compilation cache: where it goes, that a second process reads it back, and that a
flipped or truncated entry costs a recompilation and a warning, never a wrong result or a crash."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from dapo_jax import compile_cache
from dapo_jax.compile_cache import ENV, cache_dir, enable_compilation_cache, host_tag

# A child process: enable the cache as the CLI does, compile one program, print its result and the
# cache's hits / misses (JAX's monitoring events).
CHILD = textwrap.dedent("""
    import jax, jax.numpy as jnp, numpy as np
    from dapo_jax.compile_cache import enable_compilation_cache
    events = []
    jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
    print("DIR", enable_compilation_cache())
    @jax.jit
    def f(x):
        for _ in range(4):
            x = jnp.tanh(x @ x.T) + x
        return x.sum()
    x = jnp.asarray(np.arange(64, dtype=np.float32).reshape(8, 8) / 64)
    print("VALUE", repr(float(f(x))))
    print("HITS", events.count("/jax/compilation_cache/cache_hits"))
    print("MISSES", events.count("/jax/compilation_cache/cache_misses"))
""")


def run_child(cache: Path) -> dict[str, str]:
    # as a user's shell: none of the JAX cache variables the test suite sets (tests/conftest.py), so the
    # program (compiled in well under JAX's default 1 s threshold) is cached only because we lower it
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_COMPILATION_CACHE", "JAX_PERSISTENT_CACHE"))}
    env.update({ENV: str(cache), "JAX_PLATFORMS": "cpu"})
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    fields = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    fields["stderr"] = out.stderr
    return fields


def entries(cache: Path) -> list[Path]:
    return sorted(p for p in cache.glob("*-cache"))


def test_where_the_cache_goes():
    home, tag = Path.home(), host_tag()
    assert cache_dir({}) == home / ".cache" / "dapo_jax" / "xla" / tag
    assert cache_dir({"XDG_CACHE_HOME": "/x/cache"}) == Path("/x/cache/dapo_jax/xla") / tag
    assert cache_dir({ENV: "/data/xla", "XDG_CACHE_HOME": "/x"}) == Path("/data/xla") / tag
    assert cache_dir({ENV: "~/xla"}) == home / "xla" / tag
    for off in ("", "0", "off", "OFF", "none", "false"):
        assert cache_dir({ENV: off}) is None, off
    # JAX's own variable wins over ours: JAX reads it, we leave it alone
    assert cache_dir({"JAX_COMPILATION_CACHE_DIR": "/j", ENV: "/data/xla"}) is None


def test_the_host_tag_follows_the_cpu_features():
    avx512 = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f\nprocessor\t: 1\nflags\t\t: fpu sse2 avx2 avx512f\n"
    avx2 = "processor\t: 0\nflags\t\t: fpu sse2 avx2\n"
    assert host_tag(avx512) != host_tag(avx2)  # another instruction set: another folder
    assert host_tag(avx512) == host_tag(avx512.replace("processor\t: 1", "processor\t: 7"))  # core count aside
    arm = "processor\t: 0\nFeatures\t: fp asimd sve\n"
    assert host_tag(arm) != host_tag("processor\t: 0\nFeatures\t: fp asimd\n")
    assert host_tag().split("-")[0] == (__import__("platform").machine() or "unknown")


def test_an_unusable_folder_warns_and_leaves_the_cache_off(tmp_path, monkeypatch):
    blocker = tmp_path / "a_file"
    blocker.write_text("not a folder")
    set_calls = []
    monkeypatch.setattr("jax.config.update", lambda *a: set_calls.append(a))
    with pytest.warns(RuntimeWarning, match=f"compilation cache off: cannot use {blocker / 'xla' / host_tag()}.*{ENV}"):
        assert enable_compilation_cache({ENV: str(blocker / "xla")}) is None
    assert set_calls == []


def test_enable_sets_jax_config(tmp_path, monkeypatch):
    set_calls = []
    monkeypatch.setattr("jax.config.update", lambda *a: set_calls.append(a))
    folder = tmp_path / "c" / host_tag()
    assert enable_compilation_cache({ENV: str(tmp_path / "c")}) == folder
    assert folder.is_dir()
    assert set_calls == [("jax_compilation_cache_dir", str(folder)),
                         ("jax_compilation_cache_max_size", compile_cache.MAX_BYTES),
                         ("jax_persistent_cache_min_compile_time_secs", 0.0)]
    set_calls.clear()  # JAX's own variable for the threshold is left to JAX
    enable_compilation_cache({ENV: str(tmp_path / "c"), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "2"})
    assert [name for name, _ in set_calls] == ["jax_compilation_cache_dir", "jax_compilation_cache_max_size"]


def test_a_second_process_reads_the_program_back(tmp_path):
    first = run_child(tmp_path / "xla")
    assert first["DIR"] == str(tmp_path / "xla" / host_tag())
    assert int(first["HITS"]) == 0 and int(first["MISSES"]) >= 1
    assert entries(tmp_path / "xla" / host_tag())
    second = run_child(tmp_path / "xla")
    assert int(second["HITS"]) >= 1 and int(second["MISSES"]) == 0
    assert second["VALUE"] == first["VALUE"]


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_damaged_entry_recompiles_with_a_warning(tmp_path, damage):
    cache = tmp_path / "xla"
    first = run_child(cache)
    assert entries(cache / host_tag())
    for path in entries(cache / host_tag()):
        data = bytearray(path.read_bytes())
        if damage == "flip":  # bytes flipped in the middle of the compressed executable
            mid = len(data) // 2
            data[mid:mid + 8] = bytes(b ^ 0xFF for b in data[mid:mid + 8])
        else:  # a write cut short (kill -9 while JAX wrote it)
            data = data[: len(data) // 3]
        path.write_bytes(bytes(data))
    again = run_child(cache)
    assert again["VALUE"] == first["VALUE"]
    assert int(again["HITS"]) == 0
    assert "Error reading persistent compilation cache entry" in again["stderr"]


def test_the_cli_turns_it_on_for_train_and_eval_only(monkeypatch, tmp_path):
    from dapo_jax import cli

    calls = []
    monkeypatch.setattr(compile_cache, "enable_compilation_cache", lambda: calls.append(1))
    assert cli.main(["train", str(tmp_path / "missing.yaml")]) == 2
    assert cli.main(["eval", "--model", str(tmp_path / "missing")]) == 2
    assert len(calls) == 2
    with pytest.raises(SystemExit):  # `show` compiles nothing: no cache set-up
        cli.main(["show"])
    assert len(calls) == 2
