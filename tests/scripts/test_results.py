"""Figures the docs quote from experiments are recomputed from the runs kept in results/ (scripts/archive_runs.py):
a page cannot drift from the runs behind it."""

from pathlib import Path

from tests.conftest import load_script

league = load_script("league")
experiment = __import__("sys").modules["experiment"]
REPO = Path(__file__).resolve().parents[2]


def _cells(folder: Path, key: str, digits: int = 3) -> str:
    runs = [experiment.read_run(p) for p in sorted(folder.glob("seed*"))]
    return experiment.fmt_cell(experiment.column([experiment.summarize_run(r, None) for r in runs], key), digits)


def test_process_supervision_with_the_stop_scored_as_docs_league_md_says():
    folder = REPO / "results" / "process_stop" / "grpo_process"
    assert len(list(folder.glob("seed*"))) == 3
    page = (REPO / "docs" / "league.md").read_text()
    acc, passk, drift = _cells(folder, "final_acc"), _cells(folder, "final_pass"), _cells(folder, "len_drift", 1)
    assert (acc, passk, drift) == ("0.400 ± 0.017", "0.717 ± 0.025", "2.3 ± 3.5")
    assert f"**{acc}** (pass@4 {passk}), length drift {drift} tokens" in page
