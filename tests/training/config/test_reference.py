"""docs/configuration.md is generated from the pydantic models: it must match them, list every key and
say what each one does."""

import re

from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.training.config.keys import all_keys
from dapo_jax.training.config.reference import DOC, main, render
from dapo_jax.training.config.run import RunConfig


def test_the_committed_reference_is_the_generated_one():
    assert DOC.read_text() == render(), (
        "docs/configuration.md is stale: run `python -m dapo_jax.training.config.reference --write`")
    assert main(["--check"]) == 0


def test_every_key_is_listed_with_what_it_does():
    text = render()
    rows = dict(re.findall(r"^\| `([\w.]+)` \|.*\| ([^|]*) \|$", text, flags=re.M))
    keys = [k.replace("reward.functions.", "reward.functions.N.").replace("data.sources.", "data.sources.NAME.")
            for k in all_keys(RunConfig)]
    keys = [k for k in keys if not k.startswith("objective.")] + [f"objective.{k}" for k in ObjectiveConfig.model_fields]
    assert sorted(set(keys) - set(rows)) == []
    assert sorted(k for k in keys if not rows[k].strip()) == [], "comment these keys in their config class"
    assert "0.28" in text and "`heldout`" in text  # defaults: ObjectiveConfig's eps_high, data.eval's own split


def test_check_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    import dapo_jax.training.config.reference as ref

    stale = tmp_path / "configuration.md"
    stale.write_text(render().replace("`rollout.G`", "`rollout.group`"))
    monkeypatch.setattr(ref, "DOC", stale)
    assert main(["--check"]) == 1 and "stale" in capsys.readouterr().err
