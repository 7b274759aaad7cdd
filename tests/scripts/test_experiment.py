"""scripts/experiment.py's `run_pinned`: the one way the experiment scripts (ablate, league, lr_sweep, clip_grid,
stage_compare, compare_rewards) start a run on a core of their own."""

import json
import os
import queue
import sys

from tests.conftest import load_script

load_script("ablate")  # puts scripts/ on the path and imports experiment
experiment = sys.modules["experiment"]

CHILD = """
import json, os, sys
print(json.dumps({"affinity": sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
                  "xla": os.environ.get("XLA_FLAGS"), "path": os.environ.get("PYTHONPATH"), "nice": os.nice(0),
                  "cwd": os.getcwd()}))
sys.exit(3)
"""


def test_a_child_runs_on_one_core_with_one_xla_thread_and_its_output_in_the_log(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("XLA_FLAGS", "--xla_dump_to=/nowhere")
    core = experiment.available_cores()[-1]
    cores = queue.Queue()
    cores.put(core)
    log = tmp_path / "run.log"
    log.write_text("earlier\n")
    rc = experiment.run_pinned([sys.executable, "-c", CHILD], log, cores, announce="started on core {core}", nice=5,
                               cwd=tmp_path)
    assert rc == 3  # the child's exit code, as it is
    earlier, line = log.read_text().splitlines()
    assert earlier == "earlier"  # appended, not overwritten
    seen = json.loads(line)
    if seen["affinity"] is not None:
        assert seen["affinity"] == [core]
    assert seen["xla"] == "--xla_dump_to=/nowhere " + experiment.SINGLE_THREAD_XLA
    assert seen["path"].split(os.pathsep)[0] == str(experiment.REPO)
    assert seen["nice"] >= 5 and seen["cwd"] == str(tmp_path)
    assert cores.get_nowait() == core  # the core is free again
    assert f"started on core {core}" in capsys.readouterr().out


def test_the_experiment_scripts_keep_libtpu_quiet_on_a_host_without_a_tpu(tmp_path):
    """With the `[tpu]` extra installed (`[test]` installs it) and no TPU, JAX would start libtpu, whose
    start-up errors land in every run's log; experiment.py sets the CPU backends first, as the CLI does."""
    import importlib.util
    import subprocess

    import pytest

    from dapo_jax.startup import tpu_visible

    if importlib.util.find_spec("libtpu") is None or tpu_visible():
        pytest.skip("needs libtpu installed on a host without a TPU")
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import experiment, os, jax; "
            "print(os.environ.get('JAX_PLATFORMS'), jax.devices()[0].platform)")
    out = subprocess.run([sys.executable, "-c", code, str(experiment.REPO / "scripts")], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["cpu", "cpu"]
    assert "TPU" not in out.stderr, out.stderr
