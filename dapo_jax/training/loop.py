"""`train(config)`: the whole run, a thin driver around `rl_step` (training/step.py).

    data, reward functions, mesh -> model (sharded) -> optimizer -> programs -> [resume] -> eval@0 ->
    for step: rl_step (sample until the batch is full, advantages, update) -> metrics -> checkpoint -> eval
    -> final eval and checkpoint

Everything on the device is a fixed shape (prompts padded to `data.max_prompt_length`, responses
to `rollout.max_new_tokens`, batches of exactly `gen_batch` / `train_batch` prompts), so nothing
compiles after the first step. The only host round trip of the hot path is decoding responses
for the reward functions. A rerun with the same RUN_DIR resumes from its newest checkpoint.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
import warnings
from typing import Any, Callable

import jax
import jax.numpy as jnp

from dapo_jax.objectives.adaptive_entropy import entropy_controller
from dapo_jax.parallel.host import to_global
from dapo_jax.parallel.mesh import batch_sharding, committed
from dapo_jax.parallel.peers import PeerWatch
from dapo_jax.parallel.process_data import ProcessShare, start_processes
from dapo_jax.training.actor import Actor
from dapo_jax.training.build import build_mesh, load_model, load_tokenizer, load_trained_model, sampling_config
from dapo_jax.training.config.resolve import resolve, resolved_keys
from dapo_jax.training.config.run import RunConfig
from dapo_jax.training.difficulty import build_difficulty
from dapo_jax.training.episode_source import EpisodeSource, evaluate_episodes, load_agent, tool_stop_sequences
from dapo_jax.training.evaluate import eval_key, evaluate
from dapo_jax.training.group_filter import GroupFilter
from dapo_jax.training.loggers import check_loggers, make_loggers
from dapo_jax.training.metrics import MetricsWriter, compile_count
from dapo_jax.training.overlap import Prefetcher
from dapo_jax.training.report import Progress, ReadsNothing, counters, step_row
from dapo_jax.training.rollout_log import RolloutLog
from dapo_jax.training.run_data import make_data
from dapo_jax.training.state.checkpoint import Checkpointer
from dapo_jax.training.state.guards import NonFiniteMonitor, Preemption, StepBoundary
from dapo_jax.training.state.model_identity import check_model_unchanged, record_model
from dapo_jax.training.state.run_dir import RunDir
from dapo_jax.training.state.run_state import restore, save
from dapo_jax.training.step import Learner, rl_step
from dapo_jax.training.supervised import SupervisedSource
from dapo_jax.training.update.compile_ahead import CompileAhead, abstract
from dapo_jax.training.update.critic import Critic
from dapo_jax.training.update.distill import check_teacher, load_teacher
from dapo_jax.training.update.lora import PolicyWeights
from dapo_jax.training.update.programs import attention_report, build_programs, run_optimizer
from dapo_jax.training.update.train_step import init_train_state


def train(cfg: RunConfig) -> dict:
    """Runs (or resumes) the configured training; returns the final metrics row.

    Everything that can be checked is checked before the model loads and before anything is
    written to the run dir: data files, reward functions, the run dir itself (a lock: one run at a
    time), the config against the one the run started with. Raises `ConfigError` / `DataError` /
    `CheckpointError` for what the user must fix, `RunStopped` (`NonFiniteError`, `Preempted`) when
    the run stopped early, `StarvationError` when dynamic sampling could not fill a batch.
    """
    cfg, chosen = resolve(cfg), resolved_keys(cfg, resolve(cfg))  # the unset fast paths (config.py's resolve)
    run_dir = RunDir(cfg)
    objective, r = cfg.objective_config, cfg.rollout
    group_filter = GroupFilter(objective, group_size=r.G) if objective.gfpo else None
    start_processes(cfg.mesh.distributed)  # a multi-process run: before any other JAX call
    main = jax.process_index() == 0  # only process 0 prints and writes logs
    say = print if main else _silent
    compile_count()  # install the listener before anything compiles
    if chosen:  # also in RUN_DIR/config.yaml, as every key
        say("[dapo-jax] resolved: " + ", ".join(f"{k}={str(v).lower()}" for k, v in chosen.items()), flush=True)

    tokenizer = load_tokenizer(cfg)
    stream, eval_stream, scorer = make_data(cfg, tokenizer, objective)
    if cfg.distill is not None:  # on-policy distillation: the teacher reads the same token ids (one line if not)
        check_teacher(cfg, tokenizer)
    check_loggers(cfg)  # on every process: only process 0 builds them, once the model has loaded
    # process supervision (docs/objectives.md#process-supervision): a process reward model's step rewards,
    # else the first reward function's rule steps (rewards/steps.py)
    step_scorer = scorer.step_scorer(tokenizer) if objective.needs_step_rewards and cfg.agent is None else None
    # an agent run (docs/agents.md): the environment imported and tried on the first data row, before the model loads
    agent = load_agent(cfg, stream, tokenizer) if cfg.agent is not None else None
    if stream.num_skipped and main:
        warnings.warn(f"{stream.num_skipped} of {stream.num_skipped + len(stream)} training prompts are longer than "
                      f"data.max_prompt_length={cfg.data.max_prompt_length} tokens and are dropped", RuntimeWarning)
    mesh = build_mesh(cfg)
    share = ProcessShare(mesh)  # this process's rows of each generation batch (parallel/process_data.py)
    attention_report(cfg, mesh)  # model.attention=splash on a CPU: one line, before anything loads
    with run_dir, Preemption(exit_until_armed=True) as preemption, jax.set_mesh(mesh), contextlib.ExitStack() as cleanup, \
            PeerWatch():  # a lost peer process: one line naming it (parallel/peers.py)
        run_dir.check_same_config()
        check_model_unchanged(cfg, run_dir.path, say)  # its tokenizer, configs and weights (state/model_identity.py)
        model = load_model(cfg, mesh, tokenizer)
        scorer.load(mesh, dtype=cfg.model.dtype)  # learned reward models (rewards/reward_model.py): frozen, on the mesh
        policy, params = PolicyWeights.build(model, cfg.lora, seed=cfg.train.seed, mesh=mesh)  # LoRA: adapters only
        model_cfg = model.config
        ref_params = policy.reference(params) if objective.needs_reference else None
        tx, schedule = run_optimizer(cfg)
        state = init_train_state(params, tx)
        del model, params
        critic = Critic.build(cfg, mesh) if objective.uses_critic else None  # PPO / VAPO's value model
        teacher = load_teacher(cfg, mesh, tokenizer) if cfg.distill is not None else None  # frozen (update/distill.py)
        # every jitted program of the run, built where `dapo-jax plan` builds them (training/update/programs.py)
        programs = build_programs(cfg, policy=policy, model_cfg=model_cfg, mesh=mesh, tx=tx, schedule=schedule,
                                  scfg=sampling_config(cfg, tokenizer, model_cfg),
                                  eval_scfg=sampling_config(cfg, tokenizer, model_cfg, eval_mode=True),
                                  critic=critic, prompt_width=max(stream.buckets), reward_weights=scorer.weights,
                                  teacher=teacher, stop_sequences=tool_stop_sequences(tokenizer) if agent else ())
        say(f"[dapo-jax] {attention_report(cfg, mesh)}", flush=True)

        # however the run ends, a started save completes (unless it failed or a peer process is gone)
        ckpt = cleanup.enter_context(Checkpointer(run_dir.path / "checkpoints", keep=cfg.train.keep_checkpoints))
        boundary = StepBoundary(preemption, ckpt)  # SIGTERM / SIGINT and failed saves, agreed by all processes
        state, run = restore(cfg, ckpt, state, stream, say, critic.init_state if critic is not None else None,
                             new_round=run_dir.round_changes is not None)  # data.new_round (docs/mixtures.md)
        if group_filter is not None:
            group_filter.load_state_dict(run.group_filter)
        difficulty = build_difficulty(cfg, stream)  # data.difficulty (training/difficulty.py), or None
        if difficulty is not None:
            difficulty.load_state_dict(run.difficulty)
        if run_dir.round_changes is not None and run.data_round:
            run_dir.record_round(run.step, run.data_round)  # RUN_DIR/rounds.jsonl
        run_dir.save_config()  # the run really starts here
        if main:
            record_model(cfg, run_dir.path)
        writer = MetricsWriter(run_dir.path, loggers=make_loggers(cfg, run_dir.path) if main else [], enabled=main,
                               resumed_from=run.step)  # repairs a torn last line; a missing file is warned of
        cleanup.callback(writer.close)
        key = jnp.asarray(run.rng, jnp.uint32)  # a raw PRNGKey; every use folds in (step, round)
        rollout_log = RolloutLog(run_dir.path, every=cfg.train.rollouts_every, sample=cfg.train.rollouts_sample,
                                 tokenizer=tokenizer, enabled=main,
                                 sources=tuple(cfg.data.sources or ()))  # what the model wrote: `dapo-jax show`
        actor = SupervisedSource(cfg, stream, policy) if objective.supervised else Actor(  # SFT: the data's responses
            cfg, programs.generate, programs.continuous, policy, stream, share, tokenizer, scorer, step_scorer,
            group_filter, rollout_log, key, difficulty, tuple(cfg.data.sources or ())) if agent is None else \
            EpisodeSource(cfg, programs.engine, policy, stream, agent, tokenizer, scorer, rollout_log, key,
                          batch_sharding(mesh))  # episodes
        learner = Learner(programs, policy, ref_params, batch_sharding(mesh), teacher=teacher,
                          entropy_control=entropy_controller(objective),  # objective.entropy_target, or None
                          epochs=cfg.optim.epochs)
        evaluation = Evaluation(programs.generate_eval, policy, eval_stream, tokenizer, scorer.for_eval, eval_key(key),
                                batch_sharding(mesh), cfg, writer, say, programs.engine_eval, agent)
        monitor = NonFiniteMonitor(cfg.train.max_nonfinite_steps, lambda: max(ckpt.all_steps(), default=None))
        prefetch = Prefetcher(actor.collect, context=lambda: jax.set_mesh(mesh), ready=run.prefetched)  # overlap.py
        cleanup.callback(prefetch.close)
        checkpoint = functools.partial(save, ckpt, stream=stream, prefetch=prefetch, group_filter=group_filter,
                                       difficulty=difficulty)
        # the rollout's sampler and the update compile on other threads during eval@0 and the first rollout
        ahead = _compile_ahead(cfg, actor, learner, state, run, mesh)
        cleanup.callback(ahead.close)

        last = evaluation(0, state.params) if run.step == 0 else {}
        evaluated_at = 0 if run.step == 0 else None
        if critic is not None and run.step == 0 and objective.value_pretrain_steps:  # VAPO's value pre-training
            critic_state, pre = critic.pretrain(run.critic, functools.partial(actor.initial_batch, state.params), say)
            run = dataclasses.replace(run, critic=critic_state)
            if pre:
                writer.write(0, pre)
        progress = Progress(cfg, run.step, enabled=main, run_dir=run_dir.path)
        reads_nothing = ReadsNothing(run, scorer, run_dir.path)  # a reward that reads no response: exit 2
        while run.step < cfg.train.steps and not run.budget_spent(cfg):
            state, run, out = rl_step(run.step + 1, state, run, rollouts=prefetch, learner=learner, group_size=r.G,
                                      prefetch_next=r.overlap and run.step + 1 < cfg.train.steps)
            step = run.step
            ahead.wait()  # every program step 1 ran is compiled: nothing compiles after it (a no-op after)
            rollout_log.write(step, out.groups, out.advantages)
            last = writer.write(step, step_row(out, run, stream, scorer))
            progress.update(out, run, last)
            reads_nothing.check(run)
            monitor.update(step, float(out.metrics.get("nonfinite_updates", 0.0)))
            if boundary.should_stop(step):
                checkpoint(state, run)
                ckpt.wait()  # here, where a peer's death during the save is named (PeerWatch), not at exit
                raise boundary.preempted(step, ckpt.directory)
            if cfg.train.checkpoint_every and step % cfg.train.checkpoint_every == 0 and step < cfg.train.steps:
                checkpoint(state, run)
            if cfg.train.eval_every and step % cfg.train.eval_every == 0 and step < cfg.train.steps:
                last.update(evaluation(step, state.params))
                evaluated_at = step
                if cfg.train.stop_at_accuracy is not None and last.get("eval/accuracy", -1.0) >= cfg.train.stop_at_accuracy:
                    say(f"[dapo-jax] eval/accuracy {last['eval/accuracy']:.3f} reached train.stop_at_accuracy="
                        f"{cfg.train.stop_at_accuracy} at step {step}: stopping", flush=True)
                    break
        progress.close()
        if not ckpt.all_steps() or max(ckpt.all_steps()) < run.step:
            checkpoint(state, run)
        if evaluated_at != run.step:
            last.update(evaluation(run.step, state.params))
        last.update(counters(run, stream))
        if run.steps_skipped or stream.num_skipped:
            say(f"[dapo-jax] steps skipped (nothing kept): {run.steps_skipped}; prompts dropped as too long: "
                f"{stream.num_skipped}", flush=True)
        ckpt.wait()  # the last save, inside PeerWatch: a peer killed during it is named as such
    return last


@dataclasses.dataclass(frozen=True)
class Evaluation:
    """The held-out evaluation of the run (training/evaluate.py), its prompts laid out over the mesh as in
    training; each one's results merge into its step's metrics row."""

    generate: Callable  # programs.generate_eval
    policy: Any
    stream: Any  # the held-out prompts, or None (data.eval: null)
    tokenizer: Any
    scorer: Any
    key: jax.Array  # eval_key(the run's key): the same at every evaluation, apart from the rollouts'
    rows: Any  # the prompts' sharding
    cfg: RunConfig
    writer: MetricsWriter
    say: Callable
    engine: Any = None  # an agent run's TurnEngine at the evaluation's settings: episodes (episode_source.py)
    agent: Any = None

    def __call__(self, step: int, params) -> dict:
        if self.stream is None:
            return {}
        t0 = time.perf_counter()
        if self.agent is not None:
            res = evaluate_episodes(self.engine, self.policy.sampler(params), self.agent, self.stream,
                                    tokenizer=self.tokenizer, scorer=self.scorer, key=self.key,
                                    batch_size=self.cfg.rollout.gen_batch, k=self.cfg.train.eval_k,
                                    limit=self.cfg.data.eval_size, prompt_width=self.cfg.data.max_prompt_length)
        else:
            res = evaluate(self._generate, self.policy.sampler(params), self.stream, tokenizer=self.tokenizer,
                           scorer=self.scorer, key=self.key, batch_size=self.cfg.rollout.gen_batch,
                           k=self.cfg.train.eval_k, limit=self.cfg.data.eval_size)
        res["eval/time_s"] = time.perf_counter() - t0
        self.writer.write(step, {**res, "eval/compilations": compile_count()})  # merges into the step's row
        self.say(f"[dapo-jax] step {step} eval accuracy {res['eval/accuracy']:.3f}", flush=True)
        return res

    def _generate(self, params, ids, mask, key):
        return self.generate(params, *to_global((ids, mask), self.rows), key)


def _compile_ahead(cfg: RunConfig, actor: Actor, learner: Learner, state, run, mesh) -> CompileAhead:
    """The first step's rollout and update, compiled in the background (training/update/compile_ahead.py) while the
    main thread evaluates at step 0 and samples; nothing when no step is left to run. The jobs see the
    states by their shapes and layouts only: the first update donates the arrays."""
    if run.step >= cfg.train.steps:
        return CompileAhead([])
    sampler = abstract(actor.policy.sampler(state.params))
    state, critic = abstract(committed(state)), abstract(committed(run.critic))  # as the updates commit them
    return CompileAhead([("rollout", functools.partial(actor.precompile, sampler, learner.programs)),
                         ("update", functools.partial(learner.precompile, state, critic))],
                        context=lambda: jax.set_mesh(mesh))


def _silent(*args, **kwargs) -> None:
    """`print` on every process but the first."""


__all__ = ["Evaluation", "build_mesh", "load_model", "load_tokenizer", "load_trained_model", "sampling_config",
           "train"]
