"""`resolve`: packing and compaction left unset become what applies here, at the boundary of the rows a
round halves to; what a config names is kept (the recipes' cases are in test_run.py)."""

import pytest

from dapo_jax.training.config.resolve import is_resolved, resolve, resolved_keys
from dapo_jax.training.config.run import config_from_dict


@pytest.mark.parametrize("gen_batch, G, min_rows, compaction", [
    (4, 4, 8, True),  # 16 rows halve to 8 = the floor: compaction applies
    (4, 4, 9, False),  # they would halve below the floor
    (2, 3, 3, True),  # 6 rows halve to 3
    (2, 3, 4, False),
])
def test_compaction_applies_where_a_round_halves_to_the_floor(gen_batch, G, min_rows, compaction):
    cfg = config_from_dict({"rollout": {"gen_batch": gen_batch, "G": G, "compaction_min_rows": min_rows,
                                        "train_batch": 2}, "objective": {"name": "grpo"}})
    assert not is_resolved(cfg)
    done = resolve(cfg)
    assert (done.rollout.compaction, done.optim.packing) == (compaction, True) and is_resolved(done)
    assert resolved_keys(cfg, done) == {"optim.packing": True, "rollout.compaction": compaction}
    assert resolve(done) is done  # nothing left to choose


def test_what_a_config_names_is_kept():
    cfg = config_from_dict({"rollout": {"compaction": False}, "optim": {"packing": False},
                            "objective": {"name": "grpo"}})
    assert resolve(cfg) is cfg and resolved_keys(cfg, resolve(cfg)) == {}
