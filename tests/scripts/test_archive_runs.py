"""scripts/archive_runs.py: an experiment's runs kept small (metrics gzip, config, bookkeeping) read back to the
same summaries and the same tables as the run folders."""

import gzip
import json
import sys

from tests.conftest import load_script

archive_runs = load_script("archive_runs")
league = load_script("league")
experiment = sys.modules["experiment"]


def _run(path, finals, torn=False):
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(json.dumps({"rollout": {"G": 8}}))
    rows = [{"step": 0, "eval/accuracy": 0.2}]
    rows += [{"step": s, "generated_groups": 16, "entropy_generated": 0.1 * s, "response_length_mean": 80 + s}
             for s in (1, 2, 3)]
    rows.append({"step": 3, "eval/accuracy": finals})
    text = "\n".join(json.dumps(r) for r in rows) + "\n" + ('{"step": 4, "entro' if torn else "")
    (path / "metrics.jsonl").write_text(text)
    (path / "checkpoints").mkdir()
    (path / "checkpoints" / "big.bin").write_bytes(b"x" * 4096)  # not kept
    experiment.record(path, steps=3, finished=True, wall_s=[12.5])


def test_an_archive_reads_back_to_the_same_summaries_and_table(tmp_path):
    runs, out = tmp_path / "runs", tmp_path / "results"
    for seed, final in enumerate((0.3, 0.4)):
        _run(runs / "grpo" / f"seed{seed}", final, torn=seed == 1)
        _run(runs / "dapo" / f"seed{seed}", final + 0.1)
    (runs / "gspo" / "seed0").mkdir(parents=True)  # started, never wrote a metric: left out, named
    assert archive_runs.main([str(runs), str(out)]) == 0
    kept = sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file())
    assert kept == [f"{row}/seed{s}/{f}" for row in ("dapo", "grpo") for s in (0, 1)
                    for f in ("config.yaml", "experiment.json", "metrics.jsonl.gz")]
    again = (out / "grpo" / "seed1" / "metrics.jsonl.gz").read_bytes()
    archive_runs.main([str(runs), str(out)])
    assert (out / "grpo" / "seed1" / "metrics.jsonl.gz").read_bytes() == again  # a rerun changes no byte
    assert gzip.decompress(again) == (runs / "grpo" / "seed1" / "metrics.jsonl").read_bytes()
    rows = [r for r in league.ROWS if r.key in ("grpo", "dapo")]
    summaries = {}
    for where in (runs, out):
        got = {r.key: [experiment.summarize_run(experiment.read_run(where / r.key / f"seed{s}"), 0.3) for s in (0, 1)]
               for r in rows}
        summaries[where] = got
        assert experiment.is_finished(experiment.Job("grpo", 0, "GRPO", where / "grpo" / "seed0", None, (), 3))
    assert summaries[runs] == summaries[out] and summaries[out]["grpo"][1]["final_acc"] == 0.4
    tables = [league.markdown_table(rows, summaries[w], league.TABLE_COLUMNS) for w in (runs, out)]
    assert tables[0] == tables[1] and "| GRPO | 0.350 ± 0.071 |" in tables[1]


def test_nothing_to_archive_is_exit_2(tmp_path, capsys):
    assert archive_runs.main([str(tmp_path / "absent"), str(tmp_path / "out")]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_a_chain_of_stages_keeps_its_stages_file_and_every_stage_config(tmp_path):
    run = tmp_path / "runs" / "dapo" / "seed0"
    _run(run, 0.3)
    (run / "stages.yaml").write_text("run_dir: x\nstages: []\n")
    for stage in ("0-dapo", "1-rft"):
        (run / stage / "model").mkdir(parents=True)
        (run / stage / "config.yaml").write_text(f"# {stage}\n")
        (run / stage / "model" / "model.safetensors").write_bytes(b"w" * 1024)  # weights: not kept
        (run / stage / "kept.jsonl").write_text("{}\n")  # not kept
    assert archive_runs.main([str(tmp_path / "runs"), str(tmp_path / "out")]) == 0
    dest = tmp_path / "out" / "dapo" / "seed0"
    kept = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file())
    assert kept == ["0-dapo/config.yaml", "1-rft/config.yaml", "config.yaml", "experiment.json", "metrics.jsonl.gz",
                    "stages.yaml"]
    assert (dest / "1-rft" / "config.yaml").read_text() == "# 1-rft\n"
