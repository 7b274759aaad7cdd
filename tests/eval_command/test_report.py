"""The eval report: flat metric keys (the run's own set as eval/...), results JSON and samples JSONL paths."""

import json

from dapo_jax.eval_command.report import default_out, flat_metrics, print_report, write_report

REPORT = {"model": "m", "model_path": "/x/Qwen2.5-0.5B", "step": 0, "run_dir": None,
          "settings": {"k": 2, "temperature": 1.0, "top_p": 1.0, "top_k": 0, "max_new_tokens": 8, "batch_size": 4,
                       "seed": 0},
          "results": {"gsm8k": {"accuracy": 0.5, "avg@2": 0.5, "pass@2": 0.75, "maj@2": 0.5, "problems": 2.0,
                                "response_length_mean": 3.0, "truncated_fraction": 0.0, "skipped_too_long": 0,
                                "time_s": 1.0, "own": False, "source": "g.jsonl"}},
          "records": {"gsm8k": [{"index": 0, "responses": []}, {"index": 1, "responses": []}]},
          "training_eval": None}


def test_flat_keys_and_default_paths(tmp_path):
    flat = flat_metrics(REPORT)
    assert flat["step"] == 0 and flat["gsm8k/pass@2"] == 0.75 and "gsm8k/own" not in flat and "gsm8k/source" not in flat
    assert str(default_out(REPORT)) == "eval_results/Qwen2.5-0.5B.json"
    assert str(default_out({**REPORT, "run_dir": "runs/a", "step": 30})) == "runs/a/eval/step_30.json"


def test_write_report_puts_samples_beside_the_results(tmp_path):
    out, samples = write_report(REPORT, tmp_path / "r" / "res.json")
    assert samples == tmp_path / "r" / "res.gsm8k.samples.jsonl"
    assert [json.loads(line)["index"] for line in samples.read_text().splitlines()] == [0, 1]
    data = json.loads(out.read_text())
    assert "records" not in data and data["samples"] == {"gsm8k": str(samples)}


def test_printed_table_plain_and_rich(capsys):
    print_report(REPORT, plain=True)
    out = capsys.readouterr().out
    assert "gsm8k" in out and "0.750" in out and "k=2" in out
    print_report({**REPORT, "training_eval": {"step": 3, "accuracy": 0.25, "differs": ["k 2 (run: 4)"],
                                              "reproduced": False}}, plain=False)
    out = capsys.readouterr().out
    assert "0.750" in out and "differs in k 2 (run: 4)" in out
