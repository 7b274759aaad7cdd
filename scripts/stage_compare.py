"""R1's pieces against RL alone on the chain-of-thought task, in miniature: cold-start SFT + DAPO vs DAPO,
on-policy distillation from a DAPO model vs DAPO, and rejection-sampling fine-tuning's gain after DAPO.

    python scripts/stage_compare.py [--jobs 2] [--seeds 0,1,2] [--out runs/stage_compare] [--budget SAMPLES]
                                    [--sft-examples 300] [--sft-steps 30] [--rft-limit 256] [--rft-steps 10]
                                    [--report FILE] [--report-only]

Three arms per seed, each one `dapo-jax stages` chain (docs/stages.md) in OUT/ARM/seedS/ (its stages file
`stages.yaml` beside its stage folders), `--jobs` chains at a time, each its own process on one core:

- `dapo`: cot_dapo until `--budget` generated responses (`train.max_samples`), then an `rft` stage
  (cot_sft on the DAPO model's own right answers to the first `--rft-limit` train problems, k 8, one a problem);
- `cold_start`: cot_sft on the reference traces of the first `--sft-examples` train problems
  (`data.train.limit`) for `--sft-steps`, then cot_dapo at the same `--budget`;
- `distill`: the shipped cot_base trained by on-policy distillation alone (`distill.task_weight=0`, dynamic
  sampling off) from the teacher `OUT/dapo/seed{--teacher-seed}/0-dapo/model`, at the same `--budget`.

A seed sets `train.seed` (sampling, initialisation) and `data.order_seed` (the order of the training prompts
and SFT examples), as scripts/league.py does; `data.seed` stays 0, since it also draws the task's problems
(the held-out ones included). A rerun of the same command skips finished chains and resumes the others.
The report: held-out avg@4 at the end of each stage, mean ± sd over seeds with each seed's value, and
A: cold start + DAPO vs DAPO (Welch), B: distillation vs DAPO (Welch), C: DAPO -> RFT vs DAPO (paired t),
D: cold start + DAPO vs the cold start alone (paired t), with bootstrap intervals and Holm's correction over
the four (scripts/significance.py).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import datetime
import json
import queue
import sys
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))  # experiment.py and significance.py beside this script
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's dapo_jax

import significance  # noqa: E402
from experiment import available_cores, done, fmt_cell, machine, record, run_pinned, say  # noqa: E402

from dapo_jax.training.metrics import read_metrics  # noqa: E402

ARMS = ("dapo", "cold_start", "distill")
TASK = {"min_terms": 2, "max_terms": 15, "min_digits": 1, "max_digits": 1, "heldout_size": 400}  # cot_dapo's
SAMPLES_PER_ROUND = 128  # cot_dapo: gen_batch 16 x G 8 (a step generates 1-3 rounds)


@dataclasses.dataclass(frozen=True)
class Plan:
    out: Path
    seeds: tuple[int, ...]
    budget: int  # generated responses of every RL stage
    sft_examples: int
    sft_steps: int
    rft_limit: int
    rft_k: int
    rft_steps: int
    teacher_seed: int
    eval_size: int

    def run(self, arm: str, seed: int) -> Path:
        return self.out / arm / f"seed{seed}"

    @property
    def teacher(self) -> Path:
        return self.run("dapo", self.teacher_seed) / "0-dapo" / "model"


def rl_overrides(plan: Plan, seed: int) -> list[str]:
    """An RL stage at the budget: evaluated at its start and its end only (train.eval_every=0)."""
    cap = -(-plan.budget // SAMPLES_PER_ROUND)  # every step generates at least one round
    return [f"train.steps={cap}", f"train.max_samples={plan.budget}", "train.eval_every=0",
            f"train.checkpoint_every={max(5, cap // 4)}", *common(plan, seed)]


def common(plan: Plan, seed: int) -> list[str]:
    return [f"train.seed={seed}", f"data.order_seed={seed}", f"data.eval_size={plan.eval_size}",
            "train.progress=false"]


def stages(plan: Plan, arm: str, seed: int) -> dict:
    """The stages file of one chain."""
    dapo = {"name": "dapo", "recipe": "cot_dapo", "overrides": rl_overrides(plan, seed)}
    if arm == "dapo":
        rft = {"prompts": {"name": "cot", "split": "train", "options": TASK}, "k": plan.rft_k, "per_prompt": 1,
               "limit": plan.rft_limit}
        chain = [dapo, {"name": "rft", "recipe": "cot_sft", "rft": rft,
                        "overrides": [f"train.steps={plan.rft_steps}", "train.eval_every=0", *common(plan, seed)]}]
    elif arm == "cold_start":
        chain = [{"name": "cold_start", "recipe": "cot_sft",
                  "overrides": [f"train.steps={plan.sft_steps}", f"data.train.limit={plan.sft_examples}",
                                "train.eval_every=0", *common(plan, seed)]}, dapo]
    elif arm == "distill":
        chain = [{"name": "distill", "recipe": "cot_dapo",
                  "overrides": [*rl_overrides(plan, seed), f"distill.teacher={plan.teacher}",
                                "distill.task_weight=0", "objective.dynamic_sampling=false"]}]
    else:
        raise ValueError(f"unknown arm {arm!r}; arms: {ARMS}")
    return {"run_dir": str(plan.run(arm, seed)), "stages": chain}


def is_finished(run: Path) -> bool:
    spec = run / "stages.yaml"
    if not spec.exists():
        return False
    names = [s["name"] for s in yaml.safe_load(spec.read_text())["stages"]]
    return all((run / f"{i}-{n}" / "model").is_dir() for i, n in enumerate(names)) or bool(done(run)["finished"])


def run_chain(plan: Plan, arm: str, seed: int, cores: queue.Queue) -> str | None:
    """`dapo-jax stages` on the chain's file in a child process pinned to a free core; its error, if any."""
    run = plan.run(arm, seed)
    if arm == "distill":  # the teacher is another chain's first stage: wait for its export
        while not plan.teacher.is_dir():
            if is_finished(plan.run("dapo", plan.teacher_seed)) or not _alive.get(("dapo", plan.teacher_seed), True):
                return f"no teacher at {plan.teacher}"
            time.sleep(5)
    run.mkdir(parents=True, exist_ok=True)
    spec = stages(plan, arm, seed)
    (run / "stages.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    t0 = time.perf_counter()
    try:
        rc = run_pinned([sys.executable, "-m", "dapo_jax.cli", "stages", str(run / "stages.yaml")],
                        run / "experiment.log", cores,
                        announce=f"[stage_compare] {arm}/seed{seed}: started on core {{core}}, log in {run / 'experiment.log'}")
    finally:
        _alive[(arm, seed)] = False
    wall = time.perf_counter() - t0
    finished = rc == 0 and is_finished(run)
    record(run, finished=finished, wall_s=[*done(run)["wall_s"], wall])
    say(f"[stage_compare] {arm}/seed{seed}: " + (f"done in {wall:.0f} s" if finished else f"FAILED (exit {rc})"))
    return None if finished else f"exit {rc}, see {run / 'experiment.log'}"


_alive: dict = {}  # (arm, seed) -> False once its chain process has ended


def run_all(plan: Plan, arms: list[str], n_jobs: int) -> list[str]:
    """Every unfinished chain, seed by seed (a cut-short experiment has whole seeds); the failures."""
    todo = [(a, s) for s in plan.seeds for a in arms if not is_finished(plan.run(a, s))]
    for a in arms:
        for s in plan.seeds:
            if (a, s) not in todo:
                say(f"[stage_compare] {a}/seed{s}: finished earlier, skipped")
    cores = queue.Queue()
    for c in (available_cores() * n_jobs)[:n_jobs]:
        cores.put(c)
    with concurrent.futures.ThreadPoolExecutor(max(1, n_jobs)) as pool:
        futures = {job: pool.submit(run_chain, plan, *job, cores) for job in todo}
        return [f"{a}/seed{s}: {f.result()}" for (a, s), f in futures.items() if f.result()]


# ----------------------------------------------------------------------------- reading the chains
def stage_evals(run: Path) -> dict[str, dict]:
    """Per stage name: its first and last held-out evaluation rows and the responses its steps generated."""
    out: dict[str, dict] = {}
    for r in chain_rows(run):
        s = out.setdefault(r["stage"], {"first": None, "last": None, "samples": 0, "G": _stage_G(run, r)})
        if r.get("generated_groups") is not None:
            s["samples"] += int(r["generated_groups"]) * s["G"]
        if "eval/accuracy" in r:
            s["first"] = s["first"] or r
            s["last"] = r
    return out


def chain_rows(run: Path) -> list[dict]:
    """RUN/metrics.jsonl(.gz) of a chain in order, each stage's rows apart (`read_metrics` keys them by
    `stage_index`: a stage's last step and the next stage's step-0 evaluation share a chain step)."""
    return [r for r in read_metrics(run) if "stage" in r]


def _stage_G(run: Path, row: dict) -> int:
    cfg = run / f"{row['stage_index']}-{row['stage']}" / "config.yaml"
    return int(yaml.safe_load(cfg.read_text())["rollout"].get("G") or 1) if cfg.exists() else 8


# (label, arm, stage, which evaluation): the table's rows
ROWS = (("base (cot_base, step 0)", "dapo", "dapo", "first"),
        ("DAPO alone", "dapo", "dapo", "last"),
        ("cold-start SFT (before DAPO)", "cold_start", "cold_start", "last"),
        ("cold-start SFT + DAPO", "cold_start", "dapo", "last"),
        ("distillation from a DAPO model", "distill", "distill", "last"),
        ("DAPO + RFT", "dapo", "rft", "last"))
# (name, arm a, stage a, arm b, stage b, paired): Δ = a's final avg@4 - b's
TESTS = (("A: cold-start SFT + DAPO vs DAPO alone", "cold_start", "dapo", "dapo", "dapo", False),
         ("B: distillation vs DAPO alone", "distill", "distill", "dapo", "dapo", False),
         ("C: DAPO + RFT vs DAPO (end of its DAPO stage)", "dapo", "rft", "dapo", "dapo", True),
         ("D: cold-start SFT + DAPO vs its SFT stage alone", "cold_start", "dapo", "cold_start", "cold_start", True))


def collect(out: Path, seeds) -> dict[tuple[str, int], dict]:
    """(arm, seed) -> stage_evals of every chain there with metrics."""
    got = {}
    for arm in ARMS:
        for s in seeds:
            run = out / arm / f"seed{s}"
            if (run / "metrics.jsonl").exists() or (run / "metrics.jsonl.gz").exists():
                got[(arm, s)] = stage_evals(run)
    return got


def values(got, seeds, arm: str, stage: str, which: str, key: str = "eval/accuracy") -> dict[int, float]:
    """seed -> the stage's first/last evaluation's `key`, for the seeds whose chain finished that stage."""
    out = {}
    for s in seeds:
        ev = got.get((arm, s), {}).get(stage)
        if ev and ev[which] is not None and (which == "first" or _stage_done(ev)):
            out[s] = float(ev[which][key])
    return out


def _stage_done(ev: dict) -> bool:
    return ev["last"] is not ev["first"] or ev["last"]["step"] > 0  # an end-of-stage evaluation exists


def report(out: Path, seeds) -> str:
    """The markdown tables: avg@4 per row (mean ± sd, each seed), then the three tests."""
    got = collect(out, seeds)
    pass_key = "eval/pass@4"
    lines = ["| arm (stage) | held-out avg@4 | pass@4 | " + " | ".join(f"seed {s}" for s in seeds)
             + " | generated responses (RL stages) |", "|---|---|---|" + "---|" * len(seeds) + "---|"]
    for label, arm, stage, which in ROWS:
        acc, passk = values(got, seeds, arm, stage, which), values(got, seeds, arm, stage, which, pass_key)
        rl = [sum(ev["samples"] for name, ev in got[(arm, s)].items()
                  if _before(got[(arm, s)], name, stage, inclusive=which == "last")) for s in acc]
        per_seed = [f"{acc[s]:.3f}" if s in acc else "–" for s in seeds]
        lines.append(f"| {label} | {fmt_cell(list(acc.values()))} | {fmt_cell(list(passk.values()))} | "
                     + " | ".join(per_seed) + f" | {fmt_cell(rl, 0)} |")
    comparisons = []
    for name, arm_a, st_a, arm_b, st_b, is_paired in TESTS:
        a, b = values(got, seeds, arm_a, st_a, "last"), values(got, seeds, arm_b, st_b, "last")
        if is_paired:
            both = [s for s in seeds if s in a and s in b]
            a, b = {s: a[s] for s in both}, {s: b[s] for s in both}
        ok = len(a) >= 2 and len(b) >= 2
        comparisons.append((name, significance.compare(list(a.values()), list(b.values()), is_paired=is_paired)
                            if ok else None, len(a), len(b)))
    adjusted = significance.holm([c.p if c else None for _, c, _, _ in comparisons])
    lines += ["", "| comparison | test | n | Δ avg@4 [bootstrap 95%] p | Holm-adjusted p | verdict |",
              "|---|---|---|---|---|---|"]
    for (name, c, na, nb), p_adj in zip(comparisons, adjusted):
        if c is None:
            lines.append(f"| {name} | – | {na} vs {nb} | too few finished runs | – | – |")
            continue
        adj = "–" if p_adj is None else f"{p_adj:.3f}" if p_adj >= 0.001 else "<0.001"
        lines.append(f"| {name} | {'paired t' if c.test == 'paired' else 'Welch'} | {c.n_a} vs {c.n_b} | "
                     f"{significance.cell(c, p_adj)} | {adj} | {significance.verdict(c, p_adj)} |")
    return "\n".join(lines)


def _before(chain: dict, name: str, stage: str, inclusive: bool) -> bool:
    """Stage `name` runs before `stage` in its chain (or is it, when `inclusive`): its samples made the model."""
    order = list(chain)
    return stage in order and (order.index(name) < order.index(stage) or (inclusive and name == stage))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=2, help="chains trained at once, each on its own core")
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--out", type=Path, default=Path("runs/stage_compare"), help="the chains' folder")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--budget", type=int, default=12800, help="generated responses of every RL stage")
    ap.add_argument("--sft-examples", type=int, default=300, help="cold start: reference traces of the first N problems")
    ap.add_argument("--sft-steps", type=int, default=30)
    ap.add_argument("--rft-limit", type=int, default=256, help="rft: the first N train problems sampled")
    ap.add_argument("--rft-k", type=int, default=8)
    ap.add_argument("--rft-steps", type=int, default=10)
    ap.add_argument("--teacher-seed", type=int, default=None, help="whose DAPO stage teaches (default: the first seed)")
    ap.add_argument("--eval-size", type=int, default=200)
    ap.add_argument("--report", type=Path, default=None, help="also write the tables to this markdown file")
    ap.add_argument("--report-only", action="store_true", help="train nothing: the tables from the chains in --out")
    args = ap.parse_args(argv)
    seeds = tuple(int(s) for s in args.seeds.split(",") if s.strip())
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if not seeds or set(arms) - set(ARMS):
        print(f"stage_compare: --seeds needs a seed and --arms only {ARMS}", file=sys.stderr)
        return 2
    if "distill" in arms and "dapo" not in arms and args.teacher_seed is None:
        print("stage_compare: the distill arm's teacher is the dapo arm's: run both", file=sys.stderr)
        return 2
    plan = Plan(args.out, seeds, args.budget, args.sft_examples, args.sft_steps, args.rft_limit, args.rft_k,
                args.rft_steps, seeds[0] if args.teacher_seed is None else args.teacher_seed, args.eval_size)
    failed = []
    if not args.report_only:
        t0 = time.time()
        failed = run_all(plan, arms, args.jobs)
        (args.out / "session.json").write_text(json.dumps(
            {"start": datetime.datetime.fromtimestamp(t0, datetime.timezone.utc).isoformat(timespec="seconds"),
             "end": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
             "machine": machine(), "argv": sys.argv[1:]}))
    text = report(args.out, seeds)
    print(text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text + "\n")
    for line in failed:
        print(f"[stage_compare] FAILED {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
