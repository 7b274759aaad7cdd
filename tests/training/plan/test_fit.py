"""`dapo-jax plan`'s fit search (training/plan/fit.py): the candidate changes come least invasive first, only
the ones the config accepts are planned, and on a chip faked small the plan names the first that fits."""

import json
import types

import pytest

from dapo_jax.training.config.run import load_config
from dapo_jax.training.plan.model_config import plan_model_config
from dapo_jax.training.plan.fit import candidates, with_overrides
from tests.training.plan.test_memory import TINY


def _fake_plan(over: list[str], programs=()):
    return types.SimpleNamespace(over=lambda: [types.SimpleNamespace(name=n) for n in over],
                                 programs=[types.SimpleNamespace(name=n) for n in programs])


def test_update_candidates_come_least_invasive_first():
    cfg = load_config(TINY, ["optim.packing=true", "mesh.data=1", "mesh.fsdp=1"])  # train_batch 16, 2 mini-batches, G 8
    model_cfg, _ = plan_model_config(cfg)
    got = list(candidates(cfg, _fake_plan(["update"], ["update: chunk 32x14", "update: chunk 16x14"]), model_cfg))
    assert got == [{"optim.micro_batches": 2}, {"optim.micro_batches": 4}, {"optim.micro_batches": 8},
                   {"optim.packing_rows": 16}, {"optim.packing_rows": 8},  # not below G = 8 (a chunk holds a group)
                   {"model.remat": "full"}, {"model.remat": "full", "optim.micro_batches": 2},
                   {"model.remat": "full", "optim.micro_batches": 4}, {"model.remat": "full", "optim.micro_batches": 8}]
    # a rollout that does not fit: smaller generation rounds, the same prompts within reach (gen_batch 32, 4 rounds)
    got = list(candidates(cfg, _fake_plan(["rollout"]), model_cfg))
    assert got[:2] == [{"rollout.gen_batch": 16, "rollout.max_gen_batches": 8},
                       {"rollout.gen_batch": 8, "rollout.max_gen_batches": 16}]
    assert all("optim.micro_batches" not in c and "model.remat" not in c for c in got)


def test_overrides_the_config_refuses_are_config_errors():
    from dapo_jax.training.config.base import ConfigError

    cfg = load_config(TINY, [])
    assert with_overrides(cfg, {"optim.micro_batches": 4}).optim.micro_batches == 4
    with pytest.raises(ConfigError, match="train_batch"):
        with_overrides(cfg, {"optim.micro_batches": 3})  # 16 prompts do not split into 2 x 3


@pytest.mark.slow
def test_on_a_chip_faked_small_the_plan_names_the_first_change_that_fits(tmp_path, capsys, monkeypatch):
    from dapo_jax import cli

    # A plan cache of this test's own (not the user's): a candidate's programs that the change leaves as they
    # were (the rollouts, perhaps prepare) come from it, and the second command below compiles nothing. Its
    # keys are the programs' text, so each candidate's changed update is still compiled and measured.
    monkeypatch.setenv("DAPO_JAX_PLAN_CACHE", str(tmp_path / "cache"))
    # tiny_dapo, padded update: 14.6 MB at its peak (the update), 8.4 MB with 2 micro-batches, 5.1 MB with 4
    capacity_gib = 6 / 1024
    out = tmp_path / "plan.json"
    code = cli.main(["plan", TINY, "optim.packing=false", "--device-memory", str(capacity_gib),
                     "--quiet", "--json", str(out)])
    text = capsys.readouterr().out
    assert code == 3 and "VERDICT: does not fit" in text
    data = json.loads(out.read_text())
    capacity = capacity_gib * 2**30
    assert data["peak"] > capacity
    tried = data["fit"]["tried"]
    assert [t["overrides"] for t in tried] == [{"optim.micro_batches": 2}, {"optim.micro_batches": 4}]
    assert tried[0]["peak"] > capacity >= tried[1]["peak"] and tried[0]["peak"] < data["peak"]
    assert data["fit"]["suggestion"] == {"optim.micro_batches": 4}
    assert "TO FIT: optim.micro_batches=4" in text.splitlines()[-2]  # then "wrote plan.json"
    assert cli.main(["plan", TINY, "optim.packing=false", "--device-memory", str(capacity_gib), "--quiet",
                     "--no-fit"]) == 3
    assert "TO FIT" not in capsys.readouterr().out


def test_no_cache_reaches_the_plan(monkeypatch):
    """`--no-cache` is what makes the command's plan compile everything again (the test above uses a cache)."""
    from dapo_jax import cli
    from dapo_jax.training.plan import memory as plan_mod

    class Planned(Exception):
        pass

    def fake_make_plan(cfg, *, cache, **kw):
        raise Planned(cache)

    monkeypatch.setattr(plan_mod, "make_plan", fake_make_plan)
    for argv, cache in ((["--no-cache"], False), ([], True)):
        with pytest.raises(Planned) as planned:
            cli.main(["plan", TINY, *argv])
        assert planned.value.args == (cache,), argv
