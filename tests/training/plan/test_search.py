"""`dapo-jax plan --search` (training/plan/search.py): the meshes it tries and the slice it settles on."""

import dataclasses

import pytest

from dapo_jax.training.config.run import load_config

TINY = "configs/tiny_dapo.yaml"


def test_meshes_divide_the_batches_and_the_heads_best_first():
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.training.plan.search import meshes

    cfg = load_config(TINY)  # train_batch 16 in 2 mini-batches: micro-batches of 8 prompts; gen_batch 32
    model = ModelConfig.from_pretrained("dapo_jax/assets/tiny_base")  # 4 heads, 2 KV heads, vocab 99, hidden 64
    got = meshes(cfg, model, 8)
    # tensor must divide 2 KV heads and the vocabulary 99: 1 only; data x fsdp = 8 divides 8-prompt micro-batches
    assert got == [(1, 8, 1), (2, 4, 1), (4, 2, 1), (8, 1, 1)]
    assert meshes(cfg, model, 16) == []  # a micro-batch of 8 prompts cannot split 16 ways
    wide = dataclasses.replace(model, vocab_size=128)
    assert meshes(cfg, wide, 16)[0] == (1, 8, 2)  # now tensor 2 spreads the parameters 16 ways


def test_search_settles_on_the_smallest_slice_that_fits_and_plans_the_next(monkeypatch):
    """With plans faked (a mesh fits when it splits the state 8 ways or more), the search walks v5e sizes up,
    skips the sizes whose resident state alone cannot fit without compiling, and plans one size more."""
    from dapo_jax.training.plan import search as plan_search
    from dapo_jax.training.plan.slices import parse_slice

    planned = []

    @dataclasses.dataclass
    class FakePlan:
        fits: bool
        peak: int = 1
        peak_phase: str = "update"
        capacity: int = 16 * 2**30
        topology: str = ""

        def over(self):
            return [] if self.fits else [type("P", (), {"name": "update"})()]

        def uncertain(self):  # the smallest fitting slice's eval rollout fits by its line only
            return [(type("P", (), {"name": "eval rollout"})(), 2**40)] if self.fits and self.topology == "v5e-8" else []

    def fake_make_plan(cfg, *, topology, **kw):
        m = cfg.mesh
        planned.append((topology, (m.data, m.fsdp, m.tensor)))
        return FakePlan(fits=m.fsdp * m.tensor >= 8, topology=topology)

    monkeypatch.setattr(plan_search, "make_plan", fake_make_plan)
    # the resident state is 40 GiB on one device: v5e-1 (15.75 GiB) is skipped without compiling, v5e-4 is tried
    monkeypatch.setattr(plan_search, "resident_bytes", lambda cfg, model_cfg: 40 * 2**30)
    cfg = load_config(TINY, ["rollout.gen_batch=64", "rollout.train_batch=64", "optim.num_minibatches=1"])
    result = plan_search.search(cfg, "v5e")
    assert result.best.slice_name == "v5e-8" and result.best.mesh == (1, 8, 1)
    assert result.next_up.slice_name == "v5e-16" and result.next_up.mesh == (1, 16, 1)
    assert result.tried[0].slice_name == "v5e-1" and "resident state alone" in result.tried[0].skipped
    # v5e-4: fsdp 4 is planned (10 GiB resident a device); data 2 x fsdp 2 is skipped (20 GiB resident)
    assert planned == [("v5e-4", (1, 4, 1)), ("v5e-8", (1, 8, 1)), ("v5e-16", (1, 16, 1))]
    assert [(c.slice_name, c.mesh, c.skipped is None) for c in result.tried[1:3]] == [
        ("v5e-4", (1, 4, 1), True), ("v5e-4", (2, 2, 1), False)]
    assert parse_slice(result.best.slice_name).devices == 8
    listing = plan_search.format_search(dataclasses.replace(result, best=None, tried=result.tried[:4]))
    assert "v5e-8        data 1 x fsdp 8 x tensor 1" in listing
    assert "fits (eval rollout within the rollout line's error)" in listing
    text = plan_search.format_search(dataclasses.replace(result, best=None))
    assert "VERDICT: no v5e slice fits" in text and "v5e-1" in text


def test_search_through_the_cli_needs_a_family(capsys):
    from dapo_jax import cli

    assert cli.main(["plan", TINY, "--search", "--topology", "v5p-8"]) == 2
    assert "--search takes a TPU family" in capsys.readouterr().err


@pytest.mark.parametrize("family", ["v5p", "v5litepod", "tpu7x"])
def test_a_bare_family_searches(family, monkeypatch):
    from dapo_jax import cli
    from dapo_jax.training.plan import search as plan_search

    seen = {}
    monkeypatch.setattr(plan_search, "search", lambda cfg, fam, **kw: seen.setdefault("family", fam) and
                        plan_search.SearchResult(fam, [], None, None))
    assert cli.main(["plan", TINY, "--topology", family]) == 3  # nothing fits: exit 3
    assert seen["family"] == family
