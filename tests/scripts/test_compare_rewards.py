"""scripts/compare_rewards.py: the four conditions are the intended runs of one recipe, responses are
classified as the report says, and the results land between the markers of the doc."""

from pathlib import Path
from types import SimpleNamespace

from dapo_jax.training.config.run import load_config
from tests.conftest import load_script

REPO = Path(__file__).resolve().parents[2]


compare = load_script("compare_rewards")


def test_conditions_differ_only_in_the_reward_weights_and_the_kl(tmp_path):
    args = SimpleNamespace(steps=40, eval_every=20, runs_dir=tmp_path)
    cfgs = {k: load_config(compare.CONFIG, compare.overrides(args, k, 1)) for k in compare.CONDITIONS}
    weights = {k: [(f.name, f.weight) for f in c.reward.functions] for k, c in cfgs.items()}
    assert weights["rule_kl0.04"] == weights["rule_kl0"] == [("cot", 1.0), ("reward_model", 0.0)]
    assert weights["rm_kl0.04"] == weights["rm_kl0"] == [("cot", 0.0), ("reward_model", 1.0)]
    assert {k: c.objective_config.kl_beta for k, c in cfgs.items()} == {
        "rule_kl0.04": 0.04, "rule_kl0": 0.0, "rm_kl0.04": 0.04, "rm_kl0": 0.0}
    paths = {str(Path(f.path).resolve()) for c in cfgs.values() for f in c.reward.functions if f.path}
    assert paths == {str((REPO / compare.RM_PATH).resolve())}
    for k, c in cfgs.items():
        assert (c.train.steps, c.train.seed, c.train.eval_every, c.train.checkpoint_every) == (40, 1, 20, 20)
        assert Path(c.train.run_dir) == tmp_path / k / "seed1"
        assert c.objective_config.advantage == "grpo" and c.rollout.G == 8


def test_responses_are_classified_by_the_rule_and_their_last_line():
    assert compare.classify("a1+b2=3\nAnswer: 3", "3") == "right"
    assert compare.classify("a1+b2=4\nAnswer: 4\n", "3") == "well-formed wrong"
    assert compare.classify("a1+b2=3\nAnswer: 3\n3+c1", "3") == "malformed"
    assert compare.classify("", "3") == "malformed"


def test_the_block_is_written_between_the_markers(tmp_path):
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{compare.MARK_START}\nold\n{compare.MARK_END}\nafter\n")
    compare.write_block(doc, "new results")
    assert doc.read_text() == f"intro\n{compare.MARK_START}\nnew results\n{compare.MARK_END}\nafter\n"
