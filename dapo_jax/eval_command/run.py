"""`dapo-jax eval`: a base model or any run's checkpoint on one or more data sets -> avg@k, pass@k, maj@k.

    target = resolve_target("runs/gsm8k", checkpoint=200)        # or a Hugging Face model dir, or a config
    report = run_eval(target, [parse_data("data/gsm8k/test.jsonl")], EvalFlags(k=4))
    print_report(report); write_report(report, "results.json")   # + one samples JSONL per data set

Reproducibility: the key is the run's evaluation key, `fold_in(PRNGKey(train.seed), 10_000_019)`
(`dapo_jax.training.evaluate.eval_key`), and the run's own evaluation set is read, batched and
sampled exactly as the training loop does, so evaluating a run's checkpoint at step N with the run's
settings gives the numbers in its `metrics.jsonl` at step N, to the last bit. Change any of k,
temperature, top-p/top-k, max_new_tokens, batch size, seed, prompt length or the problems and the
draws change; the report says which differ. A base model (a Hugging Face directory) has no run:
its sampling defaults come from its `generation_config.json` unless flags set them.

A run that is still training rotates its checkpoints (`train.keep_checkpoints`): the newest one that
`dapo-jax eval RUN` chose may be deleted before or while it is read. When the checkpoint was chosen
as the newest (not asked for by step) and it is gone after a failed read, the evaluation says so on
stderr and takes the newest one now on disk (a few times at most); an explicit `--checkpoint` that
disappears is an error.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from pathlib import Path

import jax
from flax import nnx

from dapo_jax.data.stream import tokenize_problems
from dapo_jax.eval_command.sets import EvalSet
from dapo_jax.models.generation_config import load_generation_config
from dapo_jax.parallel.host import to_global
from dapo_jax.parallel.mesh import batch_sharding
from dapo_jax.sampling.sampler import make_generate
from dapo_jax.training import loop, sources
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.overrides import parse_overrides
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.resolve import resolve
from dapo_jax.training.config.run import RunConfig, config_from_dict, load_config
from dapo_jax.training.evaluate import eval_key, evaluate
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.state.rotation import ROTATION_RETRIES

_BASE_RUN_DIR = "<no run: a base model>"


@dataclasses.dataclass(frozen=True)
class Target:
    """What to evaluate: a config, and the checkpoint directory to take parameters from (None = base)."""

    cfg: RunConfig
    checkpoint: Path | None
    run_dir: Path | None
    label: str
    hf_only: bool = False  # a Hugging Face directory with no run config: its generation_config.json's defaults
    newest: bool = False  # the checkpoint is the run's newest at resolve time (not asked for by step)


@dataclasses.dataclass(frozen=True)
class EvalFlags:
    """Command-line settings; None = the run's (or, for a base model, its generation config's / the default)."""

    k: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_new_tokens: int | None = None
    max_prompt_length: int | None = None
    batch_size: int | None = None
    seed: int | None = None
    limit: int | None = None


def _find_run_dir(path: Path) -> Path | None:
    for p in (path, *path.parents):
        if (p / "config.yaml").exists():
            return p
    return None


def resolve_target(model: str | Path, *, checkpoint: int | None = None, overrides=()) -> Target:
    """`model`: a run dir (its newest checkpoint, or `checkpoint`; 0 = its base model), one of its
    `checkpoints/STEP` folders, a run config YAML (its run dir's newest checkpoint, else its base
    model), or a Hugging Face model directory (config.json + weights + tokenizer)."""
    path = Path(model)
    if path.is_file() and path.suffix in (".yaml", ".yml"):
        cfg = load_config(path, overrides)
        run_dir = Path(cfg.train.run_dir)
        if checkpoint is None and not (run_dir / "checkpoints").is_dir():
            return Target(cfg, None, None, f"{cfg.model.path} (base of {path})")
        return _run_target(cfg, run_dir, checkpoint)
    if path.is_dir() and (path / "config.json").exists() and not (path / "config.yaml").exists():
        inside = _find_run_dir(path)
        if inside is not None and path.parent.name == "checkpoints":
            raise ConfigError(f"{path}: a checkpoint folder holds no Hugging Face model; pass the run dir "
                              f"{inside} with --checkpoint {path.name}")
        if checkpoint is not None:
            raise ConfigError(f"--checkpoint {checkpoint}: {path} is a Hugging Face model, not a run dir")
        data = {"model": {"path": str(path.resolve())}, "data": {"eval": None},
                "objective": {"name": "dapo", "overlong_buffer": None},  # rewards only: +1/-1, no shaping
                "train": {"run_dir": _BASE_RUN_DIR, "progress": False}}
        for key, value in parse_overrides(list(overrides)):
            node = data
            for part in key.split(".")[:-1]:
                node = node.setdefault(part, {})
            node[key.split(".")[-1]] = value
        return Target(config_from_dict(data, source=f"{path} (+ overrides)"), None, None, str(path), hf_only=True)
    run_dir = _find_run_dir(path) if path.exists() else None
    if run_dir is None:
        raise ConfigError(f"{model}: not a run directory (config.yaml), a run config (.yaml) or a Hugging Face "
                          f"model directory (config.json + model.safetensors + tokenizer files)")
    if path.name.isdigit() and path.parent.name == "checkpoints":
        if checkpoint is not None and checkpoint != int(path.name):
            raise ConfigError(f"--checkpoint {checkpoint} contradicts {path}")
        checkpoint = int(path.name)
    return _run_target(load_config(run_dir / "config.yaml", overrides), run_dir, checkpoint)


def _run_target(cfg: RunConfig, run_dir: Path, checkpoint: int | None) -> Target:
    ckpts = run_dir / "checkpoints"
    steps = sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) if ckpts.is_dir() else []
    if checkpoint == 0:
        return Target(cfg, None, run_dir, f"{run_dir} (step 0: base model {cfg.model.path})")
    newest = checkpoint is None
    if newest:
        if not steps:
            raise FileNotFoundError(f"no checkpoint under {ckpts}; --checkpoint 0 evaluates the run's base model")
        checkpoint = steps[-1]
    if checkpoint not in steps:
        raise FileNotFoundError(f"no checkpoint {checkpoint} under {ckpts}; there are {steps or 'none'} "
                                f"(0 = the base model)")
    return Target(cfg, ckpts / str(checkpoint), run_dir, f"{run_dir} (step {checkpoint})", newest=newest)




def load_checkpoint(target: Target, mesh, *, say=lambda msg: print(msg, file=sys.stderr, flush=True)):
    """`(target, model, tokenizer, step)` of the target's checkpoint; when it was the run's newest and a
    training run rotated it away before or while it was read, the newest one now on disk (said on stderr)."""
    for attempt in range(ROTATION_RETRIES + 1):
        try:
            return (target, *loop.load_trained_model(target.cfg, target.checkpoint, mesh=mesh))
        except Exception:
            if not target.newest or target.checkpoint.exists() or attempt == ROTATION_RETRIES:
                raise
            gone = target.checkpoint
            target = _run_target(target.cfg, target.run_dir, None)
            say(f"dapo-jax eval: {gone} was deleted while it was being read (the training run rotates its "
                f"checkpoints, train.keep_checkpoints); evaluating the newest one now, {target.checkpoint}")
    raise AssertionError("unreachable")


def settings_for(target: Target, flags: EvalFlags, generation) -> dict:
    """The sampling settings: flags, else the run's (a base model: generation_config.json's, else defaults)."""
    t, r = target.cfg.train, target.cfg.rollout
    base = {"k": t.eval_k, "temperature": t.eval_temperature, "top_p": t.eval_top_p, "top_k": t.eval_top_k,
            "max_new_tokens": r.max_new_tokens, "batch_size": r.gen_batch, "seed": t.seed}
    if target.hf_only:  # no run to copy: the model authors' recommendations, else our defaults
        base.update(generation.sampling_defaults())
        base["max_new_tokens"] = generation.max_new_tokens or 1024
    given = {k: v for k, v in dataclasses.asdict(flags).items() if v is not None and k in base}
    out = {**base, **given}
    checks = [("k", out["k"] >= 1), ("temperature", out["temperature"] >= 0), ("top_p", 0 < out["top_p"] <= 1),
              ("top_k", out["top_k"] >= 0), ("max_new_tokens", out["max_new_tokens"] >= 1),
              ("batch_size", out["batch_size"] >= 1)]
    for name, ok in checks:
        if not ok:
            raise ConfigError(f"--{name.replace('_', '-')} {out[name]}: out of range")
    m = target.cfg.mesh
    if out["batch_size"] % (m.data * m.fsdp):
        raise ConfigError(f"--batch-size {out['batch_size']} must divide over the mesh's data*fsdp={m.data * m.fsdp}")
    return out


def _settings_cfg(cfg: RunConfig, s: dict) -> RunConfig:
    """`cfg` with the evaluation settings in the places `sampling_config` reads (sections copied, not
    re-validated against the training objective: evaluation does not train)."""
    train = cfg.train.model_copy(update={"eval_k": s["k"], "eval_temperature": s["temperature"],
                                         "eval_top_p": s["top_p"], "eval_top_k": s["top_k"], "seed": s["seed"]})
    rollout = cfg.rollout.model_copy(update={"max_new_tokens": s["max_new_tokens"], "gen_batch": s["batch_size"]})
    return cfg.model_copy(update={"train": train, "rollout": rollout})


def run_eval(target: Target, sets: list[EvalSet], flags: EvalFlags = EvalFlags()) -> dict:
    """Evaluates the target on every set (the run's own evaluation set, named `eval`, when `sets` is
    empty); returns the report: settings, per-set metrics and the per-problem records."""
    cfg = resolve(target.cfg)  # rollout.compaction, as the run resolves it (training/config/resolve.py)
    if not sets:
        if cfg.data.eval is None:
            raise ConfigError(f"{target.label}: nothing to evaluate on: pass --data (the config has no data.eval)")
        sets = [EvalSet("eval", cfg.data.eval, cfg.reward, flags.limit or cfg.data.eval_size, own=True)]
    generation = load_generation_config(resolve_path(cfg.model.path))
    s = settings_for(target, flags, generation)
    scfg_cfg = _settings_cfg(cfg, s)
    mesh = loop.build_mesh(cfg)
    with jax.set_mesh(mesh):
        if target.checkpoint is None:
            tokenizer = loop.load_tokenizer(cfg)
            model, step = loop.load_model(cfg, mesh, tokenizer), 0
        else:
            target, model, tokenizer, step = load_checkpoint(target, mesh)
        graphdef, params = nnx.split(model)
        scfg = loop.sampling_config(scfg_cfg, tokenizer, model.config, eval_mode=True, generation=generation)
        generate = make_generate(graphdef, scfg, s["k"])

        def sharded_generate(params, ids, mask, key):  # prompts laid out over the mesh, as in training
            return generate(params, *to_global((ids, mask), batch_sharding(mesh)), key)

        results, records = {}, {}
        for spec in sets:
            t0 = time.perf_counter()
            stream, skipped = _stream(spec, cfg, tokenizer, flags.max_prompt_length)
            recs: list = []
            scorer = sources.make_scorer(spec.reward, cfg.objective_config, tokenizer=tokenizer,
                                         max_length=int(stream.buckets[0]) + s["max_new_tokens"])
            if cfg.agent is not None:  # a recipe with tools: episodes, as the run's own evaluation plays them
                results[spec.name] = _episode_results(scfg_cfg, graphdef, params, scfg, stream, tokenizer, scorer,
                                                      s, spec.limit or flags.limit, recs)
                results[spec.name].update({"skipped_too_long": skipped, "own": spec.own, "source": spec.source.name,
                                           "format": spec.source.format, "template": spec.source.template,
                                           "reward": [f.name for f in spec.reward.functions],
                                           "time_s": time.perf_counter() - t0})
                records[spec.name] = recs
                continue
            res = evaluate(sharded_generate, params, stream, tokenizer=tokenizer, scorer=scorer,
                           key=eval_key(s["seed"]),
                           batch_size=s["batch_size"], k=s["k"], limit=spec.limit or flags.limit, records=recs)
            lengths = [r["length"] for rec in recs for r in rec["responses"]]
            results[spec.name] = {
                **{k.replace("eval/", ""): v for k, v in res.items()},
                "response_length_mean": sum(lengths) / max(len(lengths), 1),
                "truncated_fraction": sum(r["truncated"] for rec in recs for r in rec["responses"]) / max(len(lengths), 1),
                "skipped_too_long": skipped, "max_prompt_length": int(stream.buckets[0]), "own": spec.own,
                "source": spec.source.name, "format": spec.source.format, "template": spec.source.template,
                "reward": [f.name for f in spec.reward.functions], "time_s": time.perf_counter() - t0}
            records[spec.name] = recs
    settings = {**s, "eos_token_ids": list(scfg.eos_token_ids)}
    report = {"model": target.label, "model_path": str(cfg.model.path), "step": step,
              "run_dir": str(target.run_dir) if target.run_dir else None, "settings": settings, "results": results,
              "records": records}
    report["training_eval"] = _compare_with_training(target, step, results, s, flags)
    return report


def _episode_results(cfg: RunConfig, graphdef, params, scfg, stream, tokenizer, scorer, s: dict, limit, recs) -> dict:
    """An agent recipe's evaluation on one set (training/episode_source.py): `k` episodes per row, the
    environment tried on the set's first row first; accuracy, pass@k, tool-call rate, turns, model ids."""
    from dapo_jax.training.episode_source import evaluate_episodes, load_agent, tool_stop_sequences, turn_engine
    from dapo_jax.training.evaluate import eval_key

    agent = load_agent(cfg, stream, tokenizer)
    engine = turn_engine(cfg, graphdef, scfg, tool_stop_sequences(tokenizer))
    res = evaluate_episodes(engine, params, agent, stream, tokenizer=tokenizer, scorer=scorer, key=eval_key(s["seed"]),
                            batch_size=s["batch_size"], k=s["k"], prompt_width=cfg.data.max_prompt_length,
                            limit=limit, records=recs)
    episodes = [e for rec in recs for e in rec["episodes"]]
    return {**{k.replace("eval/", ""): v for k, v in res.items()},
            "response_length_mean": sum(e["model_ids"] for e in episodes) / max(len(episodes), 1),  # model ids
            "truncated_fraction": sum(e["status"] in ("budget", "context", "max_turns") for e in episodes)
            / max(len(episodes), 1), "max_prompt_length": cfg.data.max_prompt_length}


def _stream(spec: EvalSet, cfg: RunConfig, tokenizer, max_prompt_length: int | None):
    """The set's prompt stream, in source order, and how many prompts it had to skip as too long.

    The run's own set uses the run's `data.max_prompt_length` (the same padding as training's
    evaluation); any other set is padded to its longest prompt (a multiple of 8), so none is dropped."""
    if max_prompt_length is None:
        if spec.own:
            max_prompt_length = cfg.data.max_prompt_length
        else:
            problems = sources.load_source(spec.source, seed=cfg.data.seed)
            examples, _ = tokenize_problems(problems, tokenizer, template=spec.source.template,
                                            max_prompt_length=1 << 30)
            longest = max(len(e.ids) for e in examples)
            max_prompt_length = -(-longest // 8) * 8
    stream = sources.make_stream(spec.source, tokenizer, max_prompt_length=max_prompt_length, seed=cfg.data.seed,
                                 shuffle=False)
    return stream, stream.num_skipped


def _compare_with_training(target: Target, step: int, results: dict, s: dict, flags: EvalFlags) -> dict | None:
    """The run's own `eval/accuracy` at this step, and which settings (if any) differ from the run's."""
    own = [name for name, res in results.items() if res.get("own")]
    if target.run_dir is None or not own or not (target.run_dir / "metrics.jsonl").exists():
        return None
    row = next((r for r in read_metrics(target.run_dir) if r["step"] == step and "eval/accuracy" in r), None)
    if row is None:
        return None
    t, r, d = target.cfg.train, target.cfg.rollout, target.cfg.data
    run = {"k": t.eval_k, "temperature": t.eval_temperature, "top_p": t.eval_top_p, "top_k": t.eval_top_k,
           "max_new_tokens": r.max_new_tokens, "batch_size": r.gen_batch, "seed": t.seed}
    differs = [f"{k} {s[k]} (run: {v})" for k, v in run.items() if s[k] != v]
    if flags.limit is not None and flags.limit != d.eval_size:
        differs.append(f"limit {flags.limit} (run: data.eval_size={d.eval_size})")
    if flags.max_prompt_length is not None and flags.max_prompt_length != d.max_prompt_length:
        differs.append(f"max_prompt_length {flags.max_prompt_length} (run: {d.max_prompt_length})")
    return {"step": step, "accuracy": row["eval/accuracy"], "differs": differs,
            "reproduced": not differs and row["eval/accuracy"] == results[own[0]]["accuracy"]}


__all__ = ["EvalFlags", "Target", "resolve_target", "run_eval", "settings_for"]
