"""Test-wide settings: 8 fake CPU devices for the sharding tests, and the ../shared locator."""

import os
from pathlib import Path

# Must happen before jax is imported anywhere: sharding tests need several (fake) devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# JAX's persistent compilation cache, shared by the xdist workers and the subprocesses tests start:
# dozens of tests compile the same tiny run's programs, and most of the suite's time is XLA compiling
# them. A hit still fires the backend-compile event, so `compile_count()` (and the tests that count
# compilations) see the same numbers; the cache key is the program's HLO and the compiler's options
# and versions, so a changed program can never get a stale executable.
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(
    __import__("tempfile").gettempdir(), f"dapo_jax_test_jax_cache_{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
# The tests' programs are tiny and run for milliseconds, but XLA's CPU backend spends seconds optimising
# each one in LLVM: without that (LLVM -O0, no expensive passes; the HLO the program is made of, its
# fusions and buffers are the same) a tiny DAPO run's test takes about half the time. Subprocesses
# inherit it, so a child and its parent still run the same machine code.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import pytest
from hypothesis import settings

# CI runs the same hypothesis examples every time (a red CI must be reproducible); locally they vary.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

SHARED = Path(os.environ.get("DAPO_JAX_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))
SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def load_script(name: str):
    """`scripts/NAME.py` imported as the module `NAME` (registered in sys.modules: dataclasses look their
    module up there); the scripts beside it are importable while it loads."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.path.insert(0, str(SCRIPTS))
    try:
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(SCRIPTS))
    return module


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test with the reason when it is absent (a user's clone)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared (reference data) ships with CI, not with the repository")
    return path


@pytest.fixture
def shared():
    return shared_path


@pytest.fixture(scope="session")
def tiny_dapo_run(tmp_path_factory):
    """`(run_dir, final metrics)` of two DAPO steps of the embedded model (it answers about a third
    right, so groups have spread and accuracies are not all 0), logging rollouts at both steps."""
    from dapo_jax.training.config.run import load_config
    from dapo_jax.training.loop import train

    run_dir = tmp_path_factory.mktemp("tiny_dapo_run") / "run"
    cfg = load_config(None, [f"train.run_dir={run_dir}", "train.steps=2", "rollout.G=4", "rollout.train_batch=4",
                             "rollout.gen_batch=8", "rollout.max_gen_batches=2", "data.eval_size=24",
                             "optim.num_minibatches=1", "train.eval_k=2", "train.checkpoint_every=0",
                             "train.eval_every=0", "train.rollouts_every=2", "train.rollouts_sample=6",
                             "train.progress=false", "train.tensorboard=false"])
    return run_dir, train(cfg)
