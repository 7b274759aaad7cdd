"""`train(config)`: the whole DAPO run, top to bottom.

    mesh -> model (sharded) -> optimizer -> [resume] -> eval@0 ->
    for step: rollout rounds (generate, decode, reward, shape, dynamic sampling) -> advantages
              -> jitted update (num_minibatches x micro_batches) -> metrics -> checkpoint -> eval
    -> final eval and checkpoint

Everything on the device is a fixed shape (prompts padded to `data.max_prompt_length`, responses
to `rollout.max_new_tokens`, batches of exactly `gen_batch` / `train_batch` prompts), so nothing
compiles after the first step. The only host round trip of the hot path is decoding responses
for the reward functions. A rerun with the same RUN_DIR resumes from its newest checkpoint.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import yaml
from flax import nnx

from dapo_jax.parallel.host import to_global, to_host
from dapo_jax.training import sources
from dapo_jax.training.checkpoint import Checkpointer
from dapo_jax.training.config import ConfigError, RunConfig, resolve_path, save_config
from dapo_jax.training.evaluate import evaluate
from dapo_jax.training.metrics import MetricsWriter, compile_count
from dapo_jax.training.rollout import Groups, collect_groups
from dapo_jax.training.train_step import Batch, TrainState, init_train_state, make_logprob_fn, make_optimizer, make_train_step

# Keys that may change between a run and its resume (they do not change the trajectory).
_RESUMABLE_CHANGES = {"train.steps", "train.progress", "train.tensorboard", "train.eval_every",
                      "train.checkpoint_every", "train.keep_checkpoints", "train.run_dir"}


def build_mesh(cfg: RunConfig):
    from dapo_jax.parallel.mesh import make_mesh, maybe_initialize_distributed

    dist = cfg.mesh.distributed
    if dist is not None:
        maybe_initialize_distributed(dist.coordinator, dist.num_processes, dist.process_id)
    n = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor
    devices = jax.devices()
    if n > len(devices):
        raise ConfigError(f"mesh: data*fsdp*tensor={n} but only {len(devices)} devices are visible")
    return make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=devices[:n])


def load_model(cfg: RunConfig, mesh):
    from dapo_jax.models.hf_io import load_pretrained, load_tokenizer

    path = resolve_path(cfg.model.path)
    if not (path / "config.json").exists():
        raise ConfigError(f"model.path: no Hugging Face checkpoint (config.json) at {path}")
    model = load_pretrained(path, mesh=mesh, param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype,
                            remat=cfg.model.remat)
    return model, load_tokenizer(path)


def sampling_config(cfg: RunConfig, tokenizer, model_cfg, *, eval_mode: bool = False):
    from dapo_jax.sampling.config import SamplingConfig

    eos = tuple(dict.fromkeys([*model_cfg.eos_token_id, *([tokenizer.eos_token_id] if tokenizer.eos_token_id is not None else [])]))
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (model_cfg.pad_token_id or 0)
    r, t = cfg.rollout, cfg.train
    return SamplingConfig(
        max_new_tokens=r.max_new_tokens,
        temperature=t.eval_temperature if eval_mode else r.temperature,
        top_p=t.eval_top_p if eval_mode else r.top_p,
        top_k=0 if eval_mode else r.top_k,
        eos_token_ids=eos, pad_token_id=int(pad),
    )


def _check_same_config(cfg: RunConfig, run_dir: Path) -> None:
    saved_file = run_dir / "config.yaml"
    if not saved_file.exists():
        return
    old, new = _flat(yaml.safe_load(saved_file.read_text())), _flat(yaml.safe_load(cfg.to_yaml()))
    diff = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and not _resumable(k))
    if diff:
        details = ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in diff[:6])
        raise ConfigError(f"{saved_file}: resuming this run with a different config ({details}); "
                          f"use a new train.run_dir")


def _resumable(key: str) -> bool:
    return key in _RESUMABLE_CHANGES or key.startswith(("data.eval.", "train.eval_")) or key in ("data.eval",
                                                                                                  "data.eval_size")


def _flat(d, prefix=""):
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        out.update(_flat(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


@dataclasses.dataclass
class _Run:
    """What the loop threads through the steps, besides the jitted state."""

    step: int
    rng: np.ndarray  # uint32 raw key data
    carry: Groups | None


def train(cfg: RunConfig) -> dict:
    """Runs (or resumes) the configured training; returns the final metrics row."""
    from tqdm.auto import tqdm

    from dapo_jax.objectives.loss import compute_advantages, dynamic_sampling_keep, shape_rewards, token_kl
    from dapo_jax.parallel.mesh import batch_sharding
    from dapo_jax.sampling.sampler import make_generate

    run_dir = Path(cfg.train.run_dir)
    _check_same_config(cfg, run_dir)
    objective = cfg.objective_config
    r, o = cfg.rollout, cfg.optim
    compile_count()  # install the listener before anything compiles

    mesh = build_mesh(cfg)
    with jax.set_mesh(mesh):
        model, tokenizer = load_model(cfg, mesh)
        graphdef, params = nnx.split(model)
        model_cfg = model.config
        save_config(cfg, run_dir)
        ref_params = jax.tree.map(jnp.copy, params) if objective.needs_reference else None
        tx, schedule = make_optimizer(o, decay_steps=cfg.train.steps * o.num_minibatches)
        state = init_train_state(params, tx)
        del model, params
        scfg = sampling_config(cfg, tokenizer, model_cfg)
        generate = make_generate(graphdef, scfg, r.G)
        generate_eval = make_generate(graphdef, sampling_config(cfg, tokenizer, model_cfg, eval_mode=True),
                                      cfg.train.eval_k)
        logprob_fn = make_logprob_fn(graphdef, temperature=scfg.logprob_temperature)
        train_step = make_train_step(
            graphdef, tx, schedule, objective=objective, num_minibatches=o.num_minibatches,
            micro_batches=o.micro_batches, temperature=scfg.logprob_temperature,
            use_ref=objective.needs_reference and objective.kl_in == "loss",
        )

        @jax.jit
        def prepare(params, ref_params, prompt_ids, prompt_mask, response_ids, response_mask, old_logp,
                    rewards, valid):
            """Reference / recomputed old log-probs and the advantages: [P, G, T] device tensors."""
            if r.recompute_old_logp:
                old_logp, _ = logprob_fn(params, prompt_ids, prompt_mask, response_ids, response_mask)
            ref_logp = jnp.zeros_like(old_logp)
            kl = None
            if ref_params is not None:
                ref_logp, _ = logprob_fn(ref_params, prompt_ids, prompt_mask, response_ids, response_mask)
                kl = token_kl(objective, old_logp, ref_logp)
            adv = compute_advantages(objective, rewards, response_mask, kl, valid=valid)
            adv = jnp.broadcast_to(adv[..., None] if adv.ndim == 2 else adv, response_mask.shape) * response_mask
            return Batch(prompt_ids, prompt_mask, response_ids, response_mask.astype(jnp.float32),
                         old_logp, adv, ref_logp)

        max_len = cfg.data.max_prompt_length
        stream = sources.make_stream(cfg.data.train, tokenizer, max_prompt_length=max_len, seed=cfg.data.seed)
        eval_stream = None
        if cfg.data.eval is not None:
            eval_stream = sources.make_stream(cfg.data.eval, tokenizer, max_prompt_length=max_len,
                                              seed=cfg.data.seed, shuffle=False)
        scorer = sources.make_scorer(cfg.reward, objective)
        ckpt = Checkpointer(run_dir / "checkpoints", keep=cfg.train.keep_checkpoints)
        run = _Run(0, np.asarray(jax.random.key_data(jax.random.PRNGKey(cfg.train.seed))), None)
        restored = ckpt.restore_latest(state)
        if restored is not None:
            state = restored.state
            run = _Run(restored.step, np.asarray(restored.meta["rng"], np.uint32),
                       Groups.from_state_dict(restored.carry) if restored.carry else None)
            stream.load_state_dict(restored.meta["stream"])
        writer = MetricsWriter(run_dir, tensorboard=cfg.train.tensorboard)
        key = jnp.asarray(run.rng, jnp.uint32)  # a raw PRNGKey; every use folds in (step, round)

        def run_eval(step: int) -> dict:
            if eval_stream is None:
                return {}
            t0 = time.perf_counter()
            def sharded_generate(params, ids, mask, k):  # prompts laid out over the mesh, as in training
                return generate_eval(params, *to_global((ids, mask), batch_sharding(mesh)), k)

            res = evaluate(sharded_generate, state.params, eval_stream, tokenizer=tokenizer, scorer=scorer,
                           key=jax.random.fold_in(key, 10_000_019), batch_size=r.gen_batch,
                           k=cfg.train.eval_k, limit=cfg.data.eval_size)
            res["eval/time_s"] = time.perf_counter() - t0
            writer.write(step, {**res, "compilations": compile_count()})
            return res

        def sample_round(step: int, round_idx: int) -> Groups:
            prompts = stream.next_batch(r.gen_batch)
            ids, pmask = prompts.input_ids, prompts.attention_mask
            ids_g, pmask_g = to_global((ids, pmask), batch_sharding(mesh))
            out = generate(state.params, ids_g, pmask_g, jax.random.fold_in(jax.random.fold_in(key, step), round_idx))
            out = to_host(out)
            p, g, t = out.response_ids.shape
            texts = sources.decode_responses(tokenizer, out.response_ids.reshape(p * g, t),
                                             out.response_mask.reshape(p * g, t))
            rewards, correct, _ = scorer(texts, [a for a in prompts.answers for _ in range(g)])
            shaped, mask = shape_rewards(objective, rewards.reshape(p, g), out.lengths, out.truncated,
                                         out.response_mask)
            return Groups(ids, pmask, out.response_ids, np.asarray(mask, np.float32), out.logprobs,
                          np.asarray(shaped, np.float32), correct.reshape(p, g), out.lengths,
                          out.truncated, np.ones(p, bool), np.zeros(p, np.int32), entropy=out.entropy)

        def keep(groups: Groups) -> np.ndarray:
            k, _ = dynamic_sampling_keep(objective, correct=groups.correct, rewards=groups.rewards)
            return np.asarray(k, bool)

        last = {}
        if run.step == 0:
            res = run_eval(0)
            if res:
                print(f"[dapo-jax] step 0 eval accuracy {res['eval/accuracy']:.3f}", flush=True)
        bar = tqdm(total=cfg.train.steps, initial=run.step, disable=not cfg.train.progress, desc="train")
        while run.step < cfg.train.steps:
            step = run.step + 1
            t0 = time.perf_counter()
            groups, stats, run.carry = collect_groups(
                lambda i: sample_round(step, i), keep if objective.dynamic_sampling else None,
                train_batch=r.train_batch, max_gen_batches=r.max_gen_batches, on_starvation=r.on_starvation,
                carry=run.carry, carry_surplus=r.carry_surplus,
            )
            t1 = time.perf_counter()
            # Prompts (groups) over ("data", "fsdp"): each device holds whole groups of its slice.
            host = (groups.prompt_ids, groups.prompt_mask, groups.response_ids, groups.response_mask,
                    groups.old_logp, groups.rewards, np.broadcast_to(groups.valid[:, None], groups.rewards.shape))
            batch = prepare(state.params, ref_params, *to_global(host, batch_sharding(mesh)))
            state, m = train_step(state, batch)
            m = to_host(m)
            t2 = time.perf_counter()
            run.step = step
            row = {**stats, **{k: v for k, v in m.items()},
                   "rollout_tokens_per_s": stats.get("rollout_tokens", 0.0) / max(t1 - t0, 1e-9),
                   "update_tokens_per_s": float(m["update_tokens"]) / max(t2 - t1, 1e-9),
                   "rollout_time_s": t1 - t0, "update_time_s": t2 - t1, "step_time_s": t2 - t0,
                   "compilations": compile_count()}
            last = writer.write(step, row)
            bar.update(1)
            bar.set_postfix(reward=f"{stats.get('reward_mean', 0):.2f}", acc=f"{stats.get('accuracy', 0):.2f}",
                            kept=f"{stats.get('kept_fraction', 0):.2f}", ent=f"{float(m.get('entropy', 0)):.2f}")
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0 and step < cfg.train.steps:
                _save(ckpt, state, run, stream)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                last.update(run_eval(step))
        bar.close()
        if not ckpt.all_steps() or max(ckpt.all_steps()) < run.step:
            _save(ckpt, state, run, stream)
        final = run_eval(run.step)
        if final:
            last.update(final)
            print(f"[dapo-jax] step {run.step} eval accuracy {final['eval/accuracy']:.3f}", flush=True)
        ckpt.close()
        writer.close()
    return last


def _save(ckpt: Checkpointer, state: TrainState, run: _Run, stream) -> None:
    meta = {"rng": [int(x) for x in np.asarray(run.rng).ravel()], "stream": stream.state_dict()}
    ckpt.save(run.step, state, meta=meta, carry=run.carry.state_dict() if run.carry is not None else None)


def load_trained_model(cfg: RunConfig, checkpoint: str | Path | None = None, *, mesh=None):
    """`(model, tokenizer, step)`: the base model with the params of `checkpoint` (a run dir, its
    `checkpoints/` folder or one `checkpoints/STEP`; None = the run dir's newest, base model if none)."""
    from dapo_jax.training.checkpoint import restore_params

    mesh = mesh or build_mesh(cfg)
    with jax.set_mesh(mesh):
        model, tokenizer = load_model(cfg, mesh)
        graphdef, params = nnx.split(model)
        path = Path(checkpoint) if checkpoint is not None else Path(cfg.train.run_dir)
        step = None
        if path.name.isdigit() and path.parent.name == "checkpoints":
            path, step = path.parent, int(path.name)
        elif (path / "checkpoints").is_dir():
            path = path / "checkpoints"
        if not path.is_dir() or not any(p.name.isdigit() for p in path.iterdir()):
            if checkpoint is not None:
                raise FileNotFoundError(f"no checkpoint under {checkpoint}")
            return model, tokenizer, 0
        tx, _ = make_optimizer(cfg.optim)
        target = jax.eval_shape(lambda p: init_train_state(p, tx), params)
        target = target._replace(params=params)
        restored = restore_params(path, target, step)
        nnx.update(model, restored.state.params)
        return model, tokenizer, restored.step
