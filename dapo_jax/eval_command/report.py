"""What `dapo-jax eval` prints and writes: a table, a results JSON, and the samples of every problem.

    print_report(report)                       # one row per data set, then how it compares with training
    paths = write_report(report, out)          # out.json (settings + metrics), out.NAME.samples.jsonl per set
    flat_metrics(report)                       # {"step": 200, "gsm8k/avg@4": ...}: the last printed line

The samples file holds one JSON object per problem (prompt, answer, and each response with its
reward, correctness, extracted answer, length and truncation), to see what the model writes and
why the reward judged it so.
"""

from __future__ import annotations

import json
from pathlib import Path

from dapo_jax.tables import print_table


def default_out(report: dict) -> Path:
    """RUN_DIR/eval/step_N.json for a run; eval_results/MODEL_NAME.json for a base model."""
    if report.get("run_dir"):
        return Path(report["run_dir"]) / "eval" / f"step_{report['step']}.json"
    return Path("eval_results") / f"{Path(report['model_path']).name}.json"


def flat_metrics(report: dict) -> dict:
    """`{"step": N, "NAME/metric": value}` over every set; the run's own set is `eval/...`, as in metrics.jsonl."""
    out = {"step": report["step"]}
    for name, res in report["results"].items():
        out.update({f"{name}/{k}": v for k, v in res.items() if isinstance(v, (int, float)) and not isinstance(v, bool)})
    return out


def print_report(report: dict, *, file=None, plain: bool | None = None) -> None:
    s = report["settings"]
    k = s["k"]
    title = (f"{report['model']}: k={k}, temperature={s['temperature']}, top_p={s['top_p']}, top_k={s['top_k']}, "
             f"max_new_tokens={s['max_new_tokens']}, batch={s['batch_size']}, seed={s['seed']}")
    rows = []
    tools = any("tool_call_rate" in r for r in report["results"].values())  # an agent recipe's episodes
    for name, r in report["results"].items():
        maj = r.get(f"maj@{k}")  # none for episodes (their answers are the environment's to judge)
        rows.append([name, f"{int(r['problems'])}", f"{r[f'avg@{k}']:.3f}", f"{r[f'pass@{k}']:.3f}",
                     "-" if maj is None else f"{maj:.3f}", f"{r['response_length_mean']:.1f}",
                     f"{r['truncated_fraction']:.2f}", str(r["skipped_too_long"]), f"{r['time_s']:.1f}"]
                    + ([f"{r.get('tool_call_rate', 0.0):.3f}", f"{r.get('turns_mean', 1.0):.2f}"] if tools else []))
    print_table(title, ["data set", "problems", f"avg@{k}", f"pass@{k}", f"maj@{k}", "mean length", "truncated",
                        "skipped", "time (s)"] + (["tool-call rate", "turns"] if tools else []), rows, file=file,
                plain=plain)
    t = report.get("training_eval")
    if t:
        if t["reproduced"]:
            msg = f"= the run's own evaluation at step {t['step']} (eval/accuracy {t['accuracy']:.4f}), reproduced exactly"
        elif t["differs"]:
            msg = (f"the run's own evaluation at step {t['step']} gave eval/accuracy {t['accuracy']:.4f}; this one "
                   f"differs in {', '.join(t['differs'])}, so its samples are other draws")
        else:
            msg = (f"the run's own evaluation at step {t['step']} gave eval/accuracy {t['accuracy']:.4f} with the "
                   f"same settings: a different value means different parameters, data or software")
        print(msg, file=file)


def write_report(report: dict, out: str | Path | None = None) -> list[Path]:
    """Writes the results JSON (without the samples) and one samples JSONL per data set; returns the paths."""
    out = Path(out) if out is not None else default_out(report)
    out.parent.mkdir(parents=True, exist_ok=True)
    paths = []
    results = {k: v for k, v in report.items() if k != "records"}
    results["samples"] = {}
    for name, recs in report["records"].items():
        path = out.with_name(f"{out.stem}.{name}.samples.jsonl")
        with open(path, "w") as f:
            for rec in recs:
                f.write(json.dumps(rec) + "\n")
        results["samples"][name] = str(path)
        paths.append(path)
    out.write_text(json.dumps(results, indent=2) + "\n")
    return [out, *paths]


__all__ = ["default_out", "flat_metrics", "print_report", "write_report"]
