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

import contextlib
import dataclasses
import time
import warnings
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.parallel.host import to_global, to_host
from dapo_jax.parallel.peers import PeerWatch
from dapo_jax.training import sources
from dapo_jax.training.checkpoint import Checkpointer, CheckpointUnreadableError
from dapo_jax.training.config import ConfigError, RunConfig, resolve_path
from dapo_jax.training.critic import Critic
from dapo_jax.training.evaluate import eval_key, evaluate
from dapo_jax.training.group_filter import GroupFilter, selection_stats
from dapo_jax.training.guards import NonFiniteMonitor, Preemption, StepBoundary
from dapo_jax.training.loggers import make_loggers
from dapo_jax.training.lora import PolicyWeights
from dapo_jax.training.metrics import MetricsWriter, compile_count
from dapo_jax.training.overlap import Prefetched, Prefetcher, pack, unpack
from dapo_jax.training.rollout import Groups, StreamedRounds, collect_groups, part_means
from dapo_jax.training.rollout_log import RolloutLog
from dapo_jax.training.run_dir import RunDir
from dapo_jax.training.programs import attention_report, build_programs, run_optimizer
from dapo_jax.training.train_step import TrainState, init_train_state, make_optimizer


def build_mesh(cfg: RunConfig):
    from dapo_jax.parallel.mesh import make_mesh
    from dapo_jax.parallel.process_data import start_processes

    start_processes(cfg.mesh.distributed)  # before any other JAX call (docs/multihost.md)
    n = cfg.mesh.data * cfg.mesh.fsdp * cfg.mesh.tensor
    devices = jax.devices()
    if n > len(devices):
        raise ConfigError(f"mesh: data*fsdp*tensor={n} but only {len(devices)} devices are visible")
    if n < len(devices) and jax.process_index() == 0:
        print(f"[dapo-jax] warning: the mesh (data={cfg.mesh.data}, fsdp={cfg.mesh.fsdp}, tensor={cfg.mesh.tensor}) "
              f"uses {n} of the {len(devices)} visible devices; the other {len(devices) - n} stay idle", flush=True)
    return make_mesh(cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor, devices=devices[:n])


def _model_path(cfg: RunConfig):
    path = resolve_path(cfg.model.path)
    if not (path / "config.json").exists():
        raise ConfigError(f"model.path: no Hugging Face checkpoint (config.json) at {path}: download one beside its "
                          f"tokenizer files (README, 'Bring your own model and data') or set model.path=DIR")
    return path


def load_tokenizer(cfg: RunConfig):
    from dapo_jax.models.hf_io import load_tokenizer as load

    return load(_model_path(cfg))


def load_model(cfg: RunConfig, mesh, tokenizer):
    """The configured model on `mesh`, checked: finite weights, a tokenizer that fits its vocabulary."""
    from dapo_jax.models.checks import check_finite_weights, check_tokenizer_fits
    from dapo_jax.models.generation_config import load_generation_config
    from dapo_jax.models.hf_io import load_pretrained

    path = _model_path(cfg)
    model = load_pretrained(path, mesh=mesh, param_dtype=cfg.model.param_dtype, dtype=cfg.model.dtype,
                            remat=cfg.model.remat, attention=cfg.model.attention)
    check_tokenizer_fits(model.config, tokenizer, source=str(path), generation=load_generation_config(path))
    check_finite_weights(model, source=str(path))
    return model


def sampling_config(cfg: RunConfig, tokenizer, model_cfg, *, eval_mode: bool = False, generation=None):
    """The sampler's settings; it stops on every EOS id of config.json, generation_config.json (read
    from model.path when `generation` is None: chat models list their end-of-turn token only there)
    and the tokenizer."""
    from dapo_jax.models.generation_config import load_generation_config, stop_token_ids
    from dapo_jax.sampling.config import SamplingConfig

    generation = generation if generation is not None else load_generation_config(_model_path(cfg))
    eos = stop_token_ids(model_cfg, generation, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (model_cfg.pad_token_id or 0)
    r, t = cfg.rollout, cfg.train
    return SamplingConfig(
        max_new_tokens=r.max_new_tokens,
        temperature=t.eval_temperature if eval_mode else r.temperature,
        top_p=t.eval_top_p if eval_mode else r.top_p,
        top_k=t.eval_top_k if eval_mode else r.top_k,
        eos_token_ids=eos, pad_token_id=int(pad), compaction=r.compaction, compaction_min_rows=r.compaction_min_rows,
    )


@dataclasses.dataclass
class _Run:
    """What the loop threads through the steps, besides the jitted state."""

    step: int
    rng: np.ndarray  # uint32 raw key data
    carry: Groups | None
    steps_skipped: int = 0  # steps with no group to train on (dynamic sampling starved under train_on_kept)
    group_filter: dict | None = None  # GFPO's streaming difficulty statistic (`GroupFilter.state_dict`)
    critic: Any = None  # the critic's TrainState (PPO / VAPO: training/critic.py)
    prefetched: Prefetched | None = None  # the next step's rollout, saved in flight (rollout.overlap)
    samples: float = 0.0  # responses the steps have generated so far, kept or not (train.max_samples)


def train(cfg: RunConfig) -> dict:
    """Runs (or resumes) the configured training; returns the final metrics row.

    Everything that can be checked is checked before the model loads and before anything is
    written to the run dir: data files, reward functions, the run dir itself (a lock: one run at a
    time), the config against the one the run started with. Raises `ConfigError` / `DataError` /
    `CheckpointError` for what the user must fix, `RunStopped` (`NonFiniteError`, `Preempted`) when
    the run stopped early, `StarvationError` when dynamic sampling could not fill a batch.
    """
    from tqdm.auto import tqdm

    from dapo_jax.objectives.loss import dynamic_sampling_keep, shape_rewards
    from dapo_jax.objectives.process import StepRewards
    from dapo_jax.parallel.mesh import batch_sharding
    from dapo_jax.parallel.process_data import ProcessShare, start_processes

    run_dir = RunDir(cfg)
    objective = cfg.objective_config
    group_filter = GroupFilter(objective, group_size=cfg.rollout.G) if objective.gfpo else None
    r = cfg.rollout
    start_processes(cfg.mesh.distributed)  # a multi-process run: before any other JAX call
    main = jax.process_index() == 0  # only process 0 prints and writes logs
    say = print if main else (lambda *a, **k: None)
    compile_count()  # install the listener before anything compiles

    tokenizer = load_tokenizer(cfg)
    stream, eval_stream, scorer = sources.make_data(cfg, tokenizer, objective)
    # process supervision (objectives.md §12): a process reward model's step rewards, else the first reward
    # function's rule steps (rewards/steps.py)
    step_scorer = scorer.step_scorer(tokenizer) if objective.needs_step_rewards else None
    if stream.num_skipped and main:
        warnings.warn(f"{stream.num_skipped} of {stream.num_skipped + len(stream)} training prompts are longer than "
                      f"data.max_prompt_length={cfg.data.max_prompt_length} tokens and are dropped", RuntimeWarning)
    mesh = build_mesh(cfg)
    share = ProcessShare(mesh)  # this process's rows of each generation batch (parallel/process_data.py)
    attention_report(cfg, mesh)  # model.attention=splash on a CPU: one line, before anything loads
    with run_dir, Preemption(exit_until_armed=True) as preemption, jax.set_mesh(mesh), contextlib.ExitStack() as cleanup, \
            PeerWatch():  # a lost peer process: one line naming it (parallel/peers.py)
        run_dir.check_same_config()
        model = load_model(cfg, mesh, tokenizer)
        scorer.load(mesh, dtype=cfg.model.dtype)  # learned reward models (rewards/reward_model.py): frozen, on the mesh
        policy, params = PolicyWeights.build(model, cfg.lora, seed=cfg.train.seed, mesh=mesh)  # LoRA: adapters only
        model_cfg = model.config
        ref_params = policy.reference(params) if objective.needs_reference else None
        tx, schedule = run_optimizer(cfg)
        state = init_train_state(params, tx)
        del model, params
        critic = Critic.build(cfg, mesh) if objective.uses_critic else None  # PPO / VAPO's value model
        # every jitted program of the run, built where `dapo-jax plan` builds them (training/programs.py)
        programs = build_programs(cfg, policy=policy, model_cfg=model_cfg, mesh=mesh, tx=tx, schedule=schedule,
                                  scfg=sampling_config(cfg, tokenizer, model_cfg),
                                  eval_scfg=sampling_config(cfg, tokenizer, model_cfg, eval_mode=True),
                                  critic=critic, prompt_width=max(stream.buckets), reward_weights=scorer.weights)
        generate, continuous, generate_eval = programs.generate, programs.continuous, programs.generate_eval
        train_step, prepare = programs.train_step, programs.prepare
        say(f"[dapo-jax] {attention_report(cfg, mesh)}", flush=True)

        # however the run ends, a started save completes (unless it failed or a peer process is gone)
        ckpt = cleanup.enter_context(Checkpointer(run_dir.path / "checkpoints", keep=cfg.train.keep_checkpoints))
        boundary = StepBoundary(preemption, ckpt)  # SIGTERM and failed saves, agreed by all processes (guards.py)
        parts_on_device = objective.multi_reward == "normalize_then_sum"  # rewards [P, G, K] per function (rewards/pipeline.py)
        state, run = _restore(cfg, ckpt, state, stream, say, critic.init_state if critic is not None else None)
        if group_filter is not None:
            group_filter.load_state_dict(run.group_filter)
        run_dir.save_config()  # the run really starts here
        writer = MetricsWriter(run_dir.path, loggers=make_loggers(cfg, run_dir.path) if main else [], enabled=main,
                               resumed_from=run.step)  # repairs a torn last line; a missing file is warned of
        cleanup.callback(writer.close)
        rollouts = RolloutLog(run_dir.path, every=cfg.train.rollouts_every, sample=cfg.train.rollouts_sample,
                              tokenizer=tokenizer, enabled=main)  # what the model wrote: `dapo-jax show`
        key = jnp.asarray(run.rng, jnp.uint32)  # a raw PRNGKey; every use folds in (step, round)
        monitor = NonFiniteMonitor(cfg.train.max_nonfinite_steps, lambda: max(ckpt.all_steps(), default=None))
        counters = lambda: {"steps_skipped": run.steps_skipped,  # noqa: E731
                            "prompts_dropped_too_long": stream.num_skipped}

        def run_eval(step: int) -> dict:
            if eval_stream is None:
                return {}
            t0 = time.perf_counter()
            def sharded_generate(params, ids, mask, k):  # prompts laid out over the mesh, as in training
                return generate_eval(params, *to_global((ids, mask), batch_sharding(mesh)), k)

            res = evaluate(sharded_generate, policy.sampler(state.params), eval_stream, tokenizer=tokenizer, scorer=scorer,
                           key=eval_key(key), batch_size=r.gen_batch,
                           k=cfg.train.eval_k, limit=cfg.data.eval_size)
            res["eval/time_s"] = time.perf_counter() - t0
            writer.write(step, {**res, "eval/compilations": compile_count()})  # merges into the step's row
            say(f"[dapo-jax] step {step} eval accuracy {res['eval/accuracy']:.3f}", flush=True)
            return res

        def sample_round(step: int, round_idx: int, params) -> Groups:
            prompts = share.prompts(stream, r.gen_batch)  # this process's rows; scored here, then gathered
            ids_g, pmask_g = share.to_global((prompts.input_ids, prompts.attention_mask), r.gen_batch)
            out = generate(policy.sampler(params), ids_g, pmask_g, jax.random.fold_in(jax.random.fold_in(key, step), round_idx))
            return score(prompts, share.local(out))

        def score(prompts, out) -> Groups:  # decode, reward, overlong shaping, GFPO's selection
            ids, pmask = prompts.input_ids, prompts.attention_mask
            p, g, t = out.response_ids.shape
            texts = sources.decode_responses(tokenizer, out.response_ids.reshape(p * g, t),
                                             out.response_mask.reshape(p * g, t))
            scored = scorer.score(texts, [a for a in prompts.answers for _ in range(g)],
                                  prompts=[x for x in prompts.texts for _ in range(g)])  # rewards/pipeline.py
            rewards, correct = scored.rewards, scored.correct
            steps = step_scorer(out.response_ids, out.response_mask, prompts.texts, prompts.answers) if step_scorer else {}
            shaped, mask = shape_rewards(objective, rewards.reshape(p, g), out.lengths, out.truncated,
                                         out.response_mask)
            groups = share.gather(Groups(ids, pmask, out.response_ids, np.asarray(mask, np.float32), out.logprobs,
                                         np.asarray(shaped, np.float32), correct.reshape(p, g), out.lengths,
                                         out.truncated, np.ones(p, bool), np.zeros(p, np.int32), entropy=out.entropy,
                                         reward_parts=scored.parts.reshape(p, g, -1), **steps),
                                  r.gen_batch)  # every process: the whole round, in row order
            if group_filter is not None:
                groups.selected = group_filter.select(groups.rewards, groups.lengths)
            return groups

        def keep(groups: Groups) -> np.ndarray:
            # with GFPO, the spread that counts is the kept subset's (group_filter.py)
            k, _ = dynamic_sampling_keep(objective, correct=groups.correct, rewards=groups.rewards,
                                         valid=groups.selected)
            return np.asarray(k, bool)

        def collect(step: int, params, carry: Groups | None):  # one step's rollout, here or on the overlap thread
            keep_fn = keep if objective.dynamic_sampling else None
            rounds = (lambda i: sample_round(step, i, params)) if continuous is None else StreamedRounds(  # noqa: E731
                continuous, policy.sampler(params), stream, jax.random.fold_in(key, step),  # the groups as they finish
                max_prompts=r.max_gen_batches * r.gen_batch, score=score, keep_fn=keep_fn,
                need=r.train_batch - (len(carry) if carry is not None else 0) if r.continuous_cap else None)
            with contextlib.closing(rounds) if continuous is not None else contextlib.nullcontext():
                out = collect_groups(
                    *rollouts.watch(step, rounds, keep_fn),
                    train_batch=r.train_batch, max_gen_batches=None if continuous else r.max_gen_batches,
                    on_starvation=r.on_starvation, carry=carry, carry_surplus=r.carry_surplus,
                )
            if continuous is not None:  # the tokens drawn for the groups the stop dropped
                out[1]["stream_dropped_tokens"] = float(rounds.dropped_tokens)
            if group_filter is not None:  # the window after this rollout: what a checkpoint holds
                run.group_filter = group_filter.state_dict()
            return out

        prefetch = Prefetcher(collect, context=lambda: jax.set_mesh(mesh), ready=run.prefetched)  # training/overlap.py
        cleanup.callback(prefetch.close)

        last = run_eval(0) if run.step == 0 else {}
        evaluated_at = 0 if run.step == 0 else None
        if critic is not None and run.step == 0:  # VAPO's value pre-training on the initial policy's rollouts
            def pretrain_batch(i: int):
                g = collect_groups(lambda j: sample_round(0, i, state.params), None, train_batch=r.train_batch, max_gen_batches=1,
                                   on_starvation="train_on_kept")[0]
                host = (g.prompt_ids, g.prompt_mask, g.response_ids, g.response_mask, g.rewards,
                        np.broadcast_to(g.valid[:, None], g.rewards.shape))
                return to_global(host, batch_sharding(mesh))

            run.critic, pre = critic.pretrain(run.critic, pretrain_batch, say)
            if pre:
                writer.write(0, pre)
        bar = tqdm(total=cfg.train.steps, initial=run.step, disable=not (cfg.train.progress and main), desc="train")
        bar.set_postfix_str("the first step compiles its programs", refresh=True)  # until step 1's metrics
        while run.step < cfg.train.steps and not _budget_spent(cfg, run):
            step = run.step + 1
            t0 = time.perf_counter()
            groups, stats, run.carry = prefetch.take(step, state.params, run.carry)  # prefetched, else collected now
            run.samples += stats.get("generated_groups", 0.0) * r.G
            t1 = time.perf_counter()
            if group_filter is not None:
                stats.update(selection_stats(groups, group_filter))
                run.group_filter = group_filter.state_dict()
            if r.overlap and step < cfg.train.steps:  # step + 1's rollout samples these params during this update
                prefetch.submit(step + 1, state.params, run.carry)
            m = {}
            if groups.valid.any():
                # Prompts (groups) over ("data", "fsdp"): each device holds whole groups of its slice.
                # GFPO's dropped responses leave the loss, its denominator and the advantages' statistics
                sel = groups.selected
                host = (groups.prompt_ids, groups.prompt_mask, groups.response_ids, groups.response_mask * sel[..., None],
                        groups.old_logp, groups.reward_parts if parts_on_device else groups.rewards,
                        groups.valid[:, None] & sel)
                steps = StepRewards(groups.step_rewards, groups.step_ends, groups.step_mask) if step_scorer else None
                critic_in = {} if critic is None else {
                    "critic_params": run.critic.params, "correct": to_global(groups.correct, batch_sharding(mesh))}
                batch, critic_batch = prepare(policy.trainer(state.params), ref_params, *to_global(host, batch_sharding(mesh)),
                                              steps=to_global(steps, batch_sharding(mesh)), **critic_in)
                state, m = train_step(state, batch, **policy.step_kwargs)
                if critic is not None:
                    run.critic, critic_metrics = critic.update(run.critic, critic_batch)
                    m = {**m, **critic_metrics}
                m = to_host(m)
            else:  # an update on padding alone would change nothing but Adam's moments and counters
                run.steps_skipped += 1
                warnings.warn(f"step {step}: dynamic sampling kept no group in {r.max_gen_batches} generation "
                              f"rounds; the update is skipped ({run.steps_skipped} skipped so far)", RuntimeWarning)
            t2 = time.perf_counter()
            rollouts.write(step, groups, batch.advantages if groups.valid.any() else None)
            run.step = step
            row = {**stats, **m, **counters(), **part_means(groups, scorer.part_names),
                   "rollout_tokens_per_s": stats.get("rollout_tokens", 0.0) / max(stats["rollout_busy_s"], 1e-9),
                   "update_tokens_per_s": float(m.get("update_tokens", 0.0)) / max(t2 - t1, 1e-9),
                   "rollout_time_s": t1 - t0, "update_time_s": t2 - t1, "step_time_s": t2 - t0,
                   "compilations": compile_count()}
            last = writer.write(step, row)
            bar.update(1)
            bar.set_postfix(reward=f"{stats.get('reward_mean', 0):.2f}", acc=f"{stats.get('accuracy', 0):.2f}",
                            kept=f"{stats.get('kept_fraction', 0):.2f}", ent=f"{float(m.get('entropy', 0)):.2f}")
            monitor.update(step, float(m.get("nonfinite_updates", 0.0)))
            if boundary.should_stop(step):
                _save(ckpt, state, run, stream, prefetch)
                raise boundary.preempted(step, ckpt.directory)
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0 and step < cfg.train.steps:
                _save(ckpt, state, run, stream, prefetch)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                last.update(run_eval(step))
                evaluated_at = step
        bar.close()
        if not ckpt.all_steps() or max(ckpt.all_steps()) < run.step:
            _save(ckpt, state, run, stream, prefetch)
        if evaluated_at != run.step:
            last.update(run_eval(run.step))
        last.update(counters())
        if run.steps_skipped or stream.num_skipped:
            say(f"[dapo-jax] steps skipped (nothing kept): {run.steps_skipped}; prompts dropped as too long: "
                f"{stream.num_skipped}", flush=True)
    return last


def _budget_spent(cfg: RunConfig, run: _Run) -> bool:
    """train.max_samples: the steps so far generated that many responses (the last step may pass it)."""
    return cfg.train.max_samples is not None and run.samples >= cfg.train.max_samples


def _restore(cfg: RunConfig, ckpt: Checkpointer, state: TrainState, stream, say,
             critic=None) -> tuple[TrainState, _Run]:
    """The newest good checkpoint's state and loop position (and `critic`'s state when given), or a
    fresh start at step 0."""
    run = _Run(0, np.asarray(jax.random.key_data(jax.random.PRNGKey(cfg.train.seed))), None, critic=critic)
    try:
        restored = ckpt.restore_latest(state, critic=critic)
    except CheckpointUnreadableError:
        if not cfg.train.fresh_start:
            raise
        say(f"[dapo-jax] no readable checkpoint in {ckpt.directory}: starting over from step 0 "
            f"(train.fresh_start=true)", flush=True)
        metrics = Path(cfg.train.run_dir) / "metrics.jsonl"
        if metrics.exists() and jax.process_index() == 0:
            metrics.rename(metrics.with_name(f"metrics.before-fresh-start-{int(time.time())}.jsonl"))
        return state, run
    if restored is None:
        return state, run
    carry, prefetched = unpack(restored.carry, restored.meta.get("prefetched"))
    run = _Run(restored.step, np.asarray(restored.meta["rng"], np.uint32), carry,
               int(restored.meta.get("steps_skipped", 0)), restored.meta.get("group_filter"), restored.critic,
               prefetched)
    run.samples = float(restored.meta.get("generated_samples", 0.0))
    sources.resume_stream(stream, restored.meta["stream"], cfg, say)  # refuses changed data (one line, exit 2)
    quarantined = f" (unreadable newer checkpoint(s) {restored.quarantined} set aside)" if restored.quarantined else ""
    say(f"[dapo-jax] resumed from step {restored.step} in {ckpt.directory}{quarantined}", flush=True)
    return restored.state, run


def _save(ckpt: Checkpointer, state: TrainState, run: _Run, stream, prefetch: Prefetcher | None = None) -> None:
    ready = prefetch.drain() if prefetch is not None else None  # first the rollout in flight: its prompts are read
    meta = {"rng": [int(x) for x in np.asarray(run.rng).ravel()], "stream": stream.state_dict(),
            "steps_skipped": run.steps_skipped, "generated_samples": run.samples}
    if run.group_filter is not None:
        meta["group_filter"] = run.group_filter
    carry, prefetched = pack(run.carry, ready)
    if prefetched is not None:
        meta["prefetched"] = prefetched
    ckpt.save(run.step, state, meta=meta, carry=carry, critic=run.critic)


def load_trained_model(cfg: RunConfig, checkpoint: str | Path | None = None, *, mesh=None, adapters: bool = False):
    """`(model, tokenizer, step)`: the base model with the params of `checkpoint` (a run dir, its
    `checkpoints/` folder or one `checkpoints/STEP`; None = the run dir's newest, base model if none).
    A LoRA run's adapters come merged into a plain Decoder, or with `adapters=True` as LoRA modules."""
    from dapo_jax.models.lora import merged_decoder
    from dapo_jax.training.checkpoint import restore_params

    mesh = mesh or build_mesh(cfg)
    with jax.set_mesh(mesh):
        tokenizer = load_tokenizer(cfg)
        model = load_model(cfg, mesh, tokenizer)
        _, params = PolicyWeights.build(model, cfg.lora, seed=cfg.train.seed, mesh=mesh)  # LoRA: the adapters
        path = Path(checkpoint) if checkpoint is not None else Path(cfg.train.run_dir)
        step = None
        if path.name.isdigit() and path.parent.name == "checkpoints":
            path, step = path.parent, int(path.name)
        elif (path / "checkpoints").is_dir():
            path = path / "checkpoints"
        if not path.is_dir() or not any(p.name.isdigit() for p in path.iterdir()):
            if checkpoint is not None:
                raise FileNotFoundError(f"no checkpoint under {checkpoint}")
            return (model if adapters else merged_decoder(model)), tokenizer, 0
        tx, _ = make_optimizer(cfg.optim)
        target = jax.eval_shape(lambda p: init_train_state(p, tx), params)
        target = target._replace(params=params)
        restored = restore_params(path, target, step)
        nnx.update(model, restored.state.params)
        return (model if adapters else merged_decoder(model)), tokenizer, restored.step
