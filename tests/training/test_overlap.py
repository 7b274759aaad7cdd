"""One-step off-policy rollouts (training/overlap.py): step k+1's rollout samples the params before
update k, on a background thread, with copies that survive the donating update; the checkpoint keeps
the rollout in flight so a resumed run equals the uninterrupted one; the config refuses overlap
without an off-policy correction."""

import json
import math
import shutil
import threading

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.run import load_config
from dapo_jax.training.overlap import Prefetched, Prefetcher, pack, unpack
from dapo_jax.training.rollout import Groups


def fake_groups(n: int, fill: float, *, g: int = 2, t: int = 3) -> Groups:
    ids = np.full((n, 4), 5, np.int32)
    return Groups(ids, np.ones_like(ids), np.full((n, g, t), 7, np.int32), np.ones((n, g, t), np.float32),
                  np.full((n, g, t), fill, np.float32), np.full((n, g), fill, np.float32), np.zeros((n, g), bool),
                  np.full((n, g), t, np.int32), np.zeros((n, g), bool), np.ones(n, bool), np.zeros(n, np.int32))


class Recorder:
    """A stub rollout: records (step, the params' version, the carry it got) and returns groups whose
    old_logp is that version, plus a carry that names its step."""

    def __init__(self, gate: threading.Event | None = None):
        self.seen, self.gate = [], gate

    def __call__(self, step, params, carry):
        if self.gate is not None:  # read the params only after the caller's update was dispatched
            assert self.gate.wait(30)
        version = int(params["version"])
        self.seen.append((step, version, None if carry is None else int(carry.rewards[0, 0]),
                          threading.current_thread() is threading.main_thread()))
        return fake_groups(2, version), {"reward_mean": float(version)}, fake_groups(1, step)


update = jax.jit(lambda p: {"version": p["version"] + 1}, donate_argnums=0)  # donates, as train_step does


def test_each_rollout_after_the_first_samples_the_params_before_the_previous_update():
    collect = Recorder()
    prefetch = Prefetcher(collect)
    params, carry, taken = {"version": jnp.asarray(0)}, None, []
    try:
        for step in (1, 2, 3, 4):  # the loop's order: take, submit the next, then the donating update
            groups, stats, carry = prefetch.take(step, params, carry)
            taken.append(int(groups.old_logp[0, 0, 0]))
            if step < 4:
                prefetch.submit(step + 1, params, carry)
            params = update(params)
    finally:
        prefetch.close()
    # step 1 is collected now with θ_0; step k+1 (k >= 1) on the worker with θ_{k-1}: one update stale
    assert [(s, v) for s, v, _, _ in collect.seen] == [(1, 0), (2, 0), (3, 1), (4, 2)]
    assert taken == [0, 0, 1, 2] and int(params["version"]) == 4
    assert [c for _, _, c, _ in collect.seen] == [None, 1, 2, 3]  # each rollout gets the previous one's carry
    assert [main for *_, main in collect.seen] == [True, False, False, False]


def test_the_snapshot_survives_the_donating_update_dispatched_before_the_rollout_reads_it():
    gate = threading.Event()
    collect = Recorder(gate)
    prefetch = Prefetcher(collect)
    params = {"version": jnp.asarray(5)}
    prefetch.submit(2, params, None)
    new = update(params)  # donates `params`' buffer while the rollout has not started reading
    gate.set()
    try:
        groups, stats, carry = prefetch.take(2, new, None)
    finally:
        prefetch.close()
    assert collect.seen == [(2, 5, None, False)] and int(new["version"]) == 6
    assert stats["reward_mean"] == 5.0 and stats["rollout_busy_s"] >= 0 and int(carry.rewards[0, 0]) == 2


def test_worker_errors_surface_in_take_and_misuse_is_refused():
    def boom(step, params, carry):
        raise ValueError(f"reward failed at step {step}")

    prefetch = Prefetcher(boom)
    prefetch.submit(3, {"version": jnp.asarray(0)}, None)
    with pytest.raises(ValueError, match="reward failed at step 3"):
        prefetch.take(3, None, None)
    prefetch.close()
    ok = Prefetcher(Recorder())
    ok.submit(2, {"version": jnp.asarray(0)}, None)
    with pytest.raises(RuntimeError, match="not taken yet"):
        ok.submit(3, {"version": jnp.asarray(0)}, None)
    with pytest.raises(RuntimeError, match="for step 2, not step 3"):
        ok.take(3, None, None)
    ok.close()


def test_the_context_is_entered_on_the_worker_thread():
    entered = []

    class Ctx:
        def __enter__(self):
            entered.append(threading.current_thread().name)

        def __exit__(self, *exc):
            return False

    prefetch = Prefetcher(Recorder(), context=Ctx)
    prefetch.submit(2, {"version": jnp.asarray(0)}, None)
    prefetch.drain()
    prefetch.close()
    assert len(entered) == 1 and entered[0].startswith("dapo-rollout")


@pytest.mark.parametrize("with_carries", [False, True])
def test_pack_unpack_round_trip_through_json_meta(with_carries):
    carry = fake_groups(1, 0.5) if with_carries else None
    ready = Prefetched(4, fake_groups(3, 0.25), {"reward_mean": 0.1 + 0.2, "gen_rounds": 2.0},
                       fake_groups(2, 0.75) if with_carries else None)
    arrays, meta = pack(carry, ready)
    meta = json.loads(json.dumps(meta))  # as the checkpoint stores it
    carry2, ready2 = unpack(arrays, meta)
    assert ready2.step == 4 and ready2.stats == ready.stats
    for a, b in ((carry, carry2), (ready.groups, ready2.groups), (ready.carry, ready2.carry)):
        assert (a is None) == (b is None)
        if a is not None:
            for k, v in a.state_dict().items():
                np.testing.assert_array_equal(v, b.state_dict()[k])
    assert pack(None, None) == (None, None) and unpack(None, None) == (None, None)
    plain, none = pack(carry, None)  # without overlap the carry item is the carried groups' arrays, as before
    assert none is None and (plain is None) == (carry is None)


def test_config_refuses_overlap_without_an_off_policy_correction():
    with pytest.raises(ConfigError, match=r"rollout\.overlap: .*off-policy correction"):
        load_config(None, ["rollout.overlap=true"])  # the default objective, dapo, has none
    cfg = load_config(None, ["rollout.overlap=true", "objective.name=dapo_tis"])
    assert cfg.rollout.overlap and cfg.recompute_old_logp  # the stale tokens' π_old is recomputed
    with pytest.raises(ConfigError, match=r"rollout\.recompute_old_logp"):
        load_config(None, ["rollout.overlap=true", "objective.name=dapo_tis", "rollout.recompute_old_logp=false"])
    with pytest.raises(ConfigError, match=r"rollout\.overlap: not in a multi-process run"):
        load_config(None, ["rollout.overlap=true", "objective.name=dapo_tis",
                           "mesh.distributed={coordinator: 'localhost:1234', num_processes: 2, process_id: 0}"])


# --- end to end: the tiny run, overlapped ----------------------------------------------------------

OVERLAP = {"objective.name": "dapo_tis", "rollout.overlap": "true", "train.steps": 3, "data.eval": "null",
           "train.keep_checkpoints": 3}


@pytest.fixture(scope="module")
def overlapped_run(tiny_model_dir, tmp_path_factory, overrides_for):
    from dapo_jax.training.loop import train

    run_dir = tmp_path_factory.mktemp("overlap") / "run"
    cfg = load_config(None, overrides_for(tiny_model_dir, run_dir, **OVERLAP))
    return cfg, run_dir, train(cfg)


@pytest.mark.slow
def test_an_overlapped_run_trains_and_corrects_the_stale_tokens(overlapped_run):
    from dapo_jax.training.metrics import read_metrics

    _, run_dir, final = overlapped_run
    rows = [r for r in read_metrics(run_dir) if "grad_norm" in r]
    assert [r["step"] for r in rows] == [1, 2, 3] and final["step"] == 3
    for r in rows:
        for key in ("loss", "grad_norm", "reward_mean", "behaviour_ratio_mean", "rollout_busy_s"):
            assert math.isfinite(r[key]), (key, r)
    assert any(r["trained_groups"] > 0 and r["grad_norm"] > 0 for r in rows), "nothing was trained on"
    # step 1 samples θ_0 and recomputes with θ_0: π_old/μ is 1 up to rounding; steps 2 and 3 sample
    # θ_{k-2} and recompute with θ_{k-1} (lr 1e-3 moves the tiny model): the ratio strays from 1
    assert abs(rows[0]["behaviour_ratio_max"] - 1) < 1e-4 and abs(rows[0]["behaviour_ratio_min"] - 1) < 1e-4
    for r in rows[1:]:
        if r["trained_groups"] > 0:
            assert r["behaviour_ratio_max"] - r["behaviour_ratio_min"] > 1e-3, r


@pytest.mark.slow
def test_resuming_after_a_checkpoint_with_a_rollout_in_flight_equals_the_uninterrupted_run(
        overlapped_run, tmp_path, overrides_for):
    from dapo_jax.training.loop import train
    from dapo_jax.training.metrics import read_metrics

    cfg, run_dir, _ = overlapped_run
    killed = tmp_path / "killed"  # as if killed after checkpoint 2: checkpoint 3 and row 3 never written
    shutil.copytree(run_dir, killed)
    shutil.rmtree(killed / "checkpoints" / "3")
    lines = (killed / "metrics.jsonl").read_text().splitlines(keepends=True)
    (killed / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x)["step"] <= 2))
    shutil.rmtree(killed / "rollouts", ignore_errors=True)
    meta = json.loads((killed / "checkpoints" / "2" / "meta" / "metadata").read_text())
    assert meta["prefetched"]["step"] == 3  # step 3's rollout was in flight at checkpoint 2, and saved

    train(load_config(None, overrides_for(cfg.model.path, killed, **OVERLAP)))
    row_a = [r for r in read_metrics(killed) if r["step"] == 3 and "grad_norm" in r]
    row_b = [r for r in read_metrics(run_dir) if r["step"] == 3 and "grad_norm" in r]
    assert len(row_a) == len(row_b) == 1
    row_a, row_b = row_a[0], row_b[0]
    timing = {"rollout_busy_s", "rollout_time_s", "update_time_s", "step_time_s", "rollout_tokens_per_s",
              "update_tokens_per_s", "compilations", "eval/compilations", "time", "wall_time"}
    differ = {k for k in row_b if k not in timing and row_a.get(k) != row_b[k]}
    assert not differ, {k: (row_a.get(k), row_b[k]) for k in differ}
    (step_a, params_a), (step_b, params_b) = (params_of(cfg, d) for d in (killed, run_dir))
    assert step_a == step_b == 3
    for x, y in zip(params_a, params_b):
        np.testing.assert_array_equal(x, y)


def params_of(cfg, run_dir):
    from flax import nnx

    from dapo_jax.training.loop import load_trained_model

    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]
