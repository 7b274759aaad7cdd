"""Test-wide settings: 8 fake CPU devices for the sharding tests, and the ../shared locator."""

import os
from pathlib import Path

# Must happen before jax is imported anywhere: sharding tests need several (fake) devices.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import pytest
from hypothesis import settings

# CI runs the same hypothesis examples every time (a red CI must be reproducible); locally they vary.
settings.register_profile("ci", derandomize=True, deadline=None)
if os.environ.get("CI"):
    settings.load_profile("ci")

SHARED = Path(os.environ.get("DAPO_JAX_SHARED", Path(__file__).resolve().parents[1].parent / "shared"))


def shared_path(*parts: str) -> Path:
    """A file under ../shared, or skip the test with the reason when it is absent (a user's clone)."""
    path = SHARED.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"{path} is absent: ../shared (reference data) ships with CI, not with the repository")
    return path


@pytest.fixture
def shared():
    return shared_path
