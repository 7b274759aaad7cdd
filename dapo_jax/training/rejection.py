"""Rejection-sampling fine-tuning's data: a model's own accepted answers, as an SFT file (docs/stages.md#rft).

    stats = rejection_sample(target, out="kept.jsonl", k=8, per_prompt=2)   # sample, judge, keep, write
    dapo-jax sft cot_sft data.train.name=kept.jsonl model.path=EXPORTED_MODEL   # then fine-tune on it

For every prompt of the run's `data.train` (in source order, the first `limit`), `k` responses are
sampled at the rollout's settings (rollout.temperature / top_p / top_k, rollout.max_new_tokens) and
scored by the run's reward functions, as the held-out evaluation does (training/evaluate.py). A
response is kept when the reward calls it correct; among a prompt's kept responses exact duplicates
(after stripping surrounding blanks) are dropped, and at most `per_prompt` are kept, the first ones
drawn. The kept set is written as JSON lines, one row per response, in the `sft` format
`dapo-jax sft` reads:

    {"prompt": the bare problem (the template is applied again at fine-tuning), "response": ...,
     "answer": the ground truth, "index": the problem's row in data.train, "reward": its reward}

so a user can read, filter or edit it before fine-tuning on it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jax
from flax import nnx

from dapo_jax.eval_command.run import load_checkpoint, resolve_target
from dapo_jax.parallel.host import to_global
from dapo_jax.parallel.mesh import batch_sharding
from dapo_jax.sampling.sampler import make_generate
from dapo_jax.training import sources
from dapo_jax.training.build import build_mesh, load_model, load_tokenizer, sampling_config
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import find_config
from dapo_jax.training.config.resolve import resolve
from dapo_jax.training.evaluate import eval_key, evaluate


def select_kept(records: list[dict], *, per_prompt: int) -> list[dict]:
    """The kept responses of evaluation `records` (one per problem, each with its `responses`): correct ones,
    deduplicated by stripped text within a prompt, at most `per_prompt` per prompt, in draw order."""
    if per_prompt < 1:
        raise ConfigError(f"--per-prompt {per_prompt}: keep at least 1 response per prompt")
    kept = []
    for rec in records:
        seen: set[str] = set()
        for r in rec["responses"]:
            text = r["text"].strip()
            if not r["correct"] or not text or text in seen or len(seen) >= per_prompt:
                continue
            seen.add(text)
            kept.append({"index": rec["index"], "response": r["text"], "reward": r["reward"]})
    return kept


def rejection_sample(cfg, params_model, tokenizer, *, out: str | Path, k: int, per_prompt: int,
                     limit: int | None = None, seed: int | None = None, mesh=None) -> dict:
    """Samples `k` responses per `data.train` prompt with `params_model` (a Decoder), keeps the accepted ones
    (`select_kept`) and writes them to `out`; returns the counts (prompts, sampled, correct, kept)."""
    if k < 1:
        raise ConfigError(f"--k {k}: sample at least 1 response per prompt")
    cfg = resolve(cfg)  # rollout.compaction, as the run resolves it (training/config/resolve.py)
    problems = {p.index: p for p in sources.load_source(cfg.data.train, seed=cfg.data.seed)}
    stream = sources.make_stream(cfg.data.train, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                                 seed=cfg.data.seed, shuffle=False)
    scorer = sources.make_scorer(cfg.reward, cfg.objective_config, tokenizer=tokenizer,
                                 max_length=cfg.data.max_prompt_length + cfg.rollout.max_new_tokens)
    scorer.load(mesh, dtype=cfg.model.dtype)
    graphdef, params = nnx.split(params_model)
    generate = make_generate(graphdef, sampling_config(cfg, tokenizer, params_model.config), k)  # the rollout's

    def sharded(p, ids, mask, key):
        return generate(p, *to_global((ids, mask), batch_sharding(mesh)), key)

    records: list[dict] = []
    key = jax.random.fold_in(eval_key(cfg.train.seed if seed is None else seed), 1)  # not the evaluation's draws
    evaluate(sharded, params, stream, tokenizer=tokenizer, scorer=scorer, key=key, batch_size=cfg.rollout.gen_batch,
             k=k, limit=limit, records=records)
    kept = select_kept(records, per_prompt=per_prompt)
    rows = [{"prompt": problems[r["index"]].problem, "response": r["response"],
             "answer": problems[r["index"]].answer, "index": r["index"], "reward": r["reward"]} for r in kept]
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text("".join(json.dumps(row, ensure_ascii=False) + "\n" for row in rows))
    os.replace(tmp, out)  # a reader never sees half a file
    correct = sum(r["correct"] for rec in records for r in rec["responses"])
    return {"prompts": len(records), "sampled": len(records) * k, "correct": int(correct), "kept": len(rows),
            "prompts_kept": len({r["index"] for r in rows}), "out": str(out)}


def run_rft(model: str, *, out: str | Path, checkpoint: int | None = None, overrides=(), k: int | None = None,
            per_prompt: int = 1, limit: int | None = None) -> dict:
    """`dapo-jax rft MODEL`: `rejection_sample` with a run's checkpoint (newest, or `checkpoint`; 0 = its base
    model), a run config's base model, or a Hugging Face model dir (as `dapo-jax eval --model` reads them);
    `k` defaults to the run's rollout.G."""
    if not Path(model).exists():  # a packaged recipe's name (tiny_dapo)
        model = str(find_config(model))
    target = resolve_target(model, checkpoint=checkpoint, overrides=overrides)
    cfg = target.cfg
    mesh = build_mesh(cfg)
    with jax.set_mesh(mesh):
        if target.checkpoint is None:
            tokenizer = load_tokenizer(cfg)
            decoder = load_model(cfg, mesh, tokenizer)
        else:
            target, decoder, tokenizer, _ = load_checkpoint(target, mesh)
        return rejection_sample(cfg, decoder, tokenizer, out=out, k=k or cfg.rollout.G, per_prompt=per_prompt,
                                limit=limit, mesh=mesh)


__all__ = ["rejection_sample", "run_rft", "select_kept"]
