"""scripts/agent_calc_task.py: its transcripts, its environments with and without the tool, a held-out set
no training row repeats, and the summary docs/agent_calc.md quotes, recomputed from results/agent_calc/."""

from pathlib import Path

import numpy as np
import pytest
from scipy import stats

from dapo_jax.agents.env import Turn
from tests.conftest import load_script

act = load_script("agent_calc_task")
REPO = Path(__file__).resolve().parents[2]


def test_a_tool_transcript_masks_the_tools_answer_only():
    row = {"problem": "12345+67890", "answer": "80235"}
    ids, mask = act.transcript(row, tool=True)
    assert act.decode(ids) == "[12345+67890]8023580235" and ids[-1] == act.EOS
    assert mask == [1] * 13 + [0] * 5 + [1] * 6
    assert len(ids) <= act.WARM_WIDTH
    ids, mask = act.transcript(row, tool=False)
    assert act.decode(ids) == "80235" and mask == [1] * 6


@pytest.mark.parametrize("env, seen", [(act.SumTask, "80235"), (act.NoToolTask, "?")])
def test_a_call_gets_the_sum_with_the_tool_and_a_question_mark_without(env, seen):
    e = env()
    e.reset({"problem": "12345+67890", "answer": "80235"})
    call = e.step(Turn("[12345+67890]", act.encode("[12345+67890]"), [], [], "tool_call"))
    assert call.observations == [{"role": "tool", "content": seen}] and not call.done
    assert call.metrics == {"tool_calls": 1.0}
    assert e.step(Turn("80235", act.encode("80235") + [act.EOS], [], [], "eos")).done
    assert e.reward() == 1.0
    e.reset({"problem": "12345+67890", "answer": "80235"})
    e.step(Turn("80234", act.encode("80234"), [], [], "eos"))
    assert e.reward() == 0.0


def test_training_rows_never_repeat_a_held_out_problem():
    heldout = act.problems(50, 7)
    rows = act.problems(200, 7, exclude=heldout)  # the same seed: without the exclusion they would coincide
    assert len(rows) == 200 and not {r["problem"] for r in rows} & {r["problem"] for r in heldout}
    for r in rows:
        a, b = map(int, r["problem"].split("+"))
        assert r["answer"] == str(a + b) and 10 ** 4 <= a < 10 ** 5 and 10 ** 4 <= b < 10 ** 5


@pytest.mark.parametrize("folder", ["agent_calc", "agent_calc_lr3e-4"])
def test_the_summary_docs_agent_calc_md_quotes_is_the_committed_runs(folder):
    path = REPO / "results" / folder / "results.json.gz"
    if folder != "agent_calc" and not path.exists():
        pytest.skip(f"results/{folder}: not kept")
    assert path.exists(), f"results/{folder}/results.json.gz: the runs docs/agent_calc.md reports"
    results = act.read_results(path.parent)
    seeds = sorted(results["runs"])
    assert len(seeds) == 3
    final = {arm: [results["runs"][s][arm]["heldout"][-1]["accuracy"] for s in seeds] for arm in act.ARMS}
    # Welch's test written out here: t = (ma - mb) / sqrt(va/na + vb/nb), Welch-Satterthwaite dof
    a, b = np.array(final["tool"]), np.array(final["no_tool"])
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    t = (a.mean() - b.mean()) / np.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    p = 2 * stats.t.sf(abs(t), dof)
    summary = act.summarize(results)
    assert summary["welch_p_accuracy"] == pytest.approx(p, rel=1e-9)
    assert summary == results["summary"]
    page = (REPO / "docs" / "agent_calc.md").read_text()
    for arm in act.ARMS:
        for key in ("accuracy", "tool_call_rate"):
            s = summary[f"{arm}_{key}"]
            assert f"{s['mean']:.3f} ± {s['sd']:.3f}" in page, f"docs/agent_calc.md: {arm} {key}"
    assert f"p = {p:.2g}" in page
