"""One whole DAPO step of a recipe's batch on whatever JAX sees: rollout, log π_old, the updates.

    python -m benchmarks.device --phases dapo_step --gen-prompts 96 --prompts 32 --group 8 \
        --minibatches 2 --micro-batches 4 --prompt-len 256 --train-new-tokens 512

(the `qwen2.5-0.5b-gsm8k-dapo` recipe's batch: 96 prompts x G 8 sampled, 32 of them trained on in 2
mini-batches of 4 micro-batches each, 512 new tokens). The step's programs are the trainer's own:
`make_generate` samples `--gen-prompts` prompts x G, `make_logprob_fn` recomputes log π_old over the
`--prompts` kept, and the packed update (built by `make_update`, as a run builds it) runs the `--minibatches` updates. What is not the
trainer's: the weights are random, so no response ends before `--train-new-tokens` (the sampler runs
with no EOS: every row decodes the whole length, the recipe's worst case) and the rewards would mean
nothing; each response gets an advantage of +1 or -1 instead (what group normalisation gives a group
of half right answers), and the reward, dynamic-sampling and advantage arithmetic (microseconds on
`[P, G]` arrays) is left out. One untimed step compiles everything; the next one is timed, stage by
stage, each stage waited for.
"""

from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from dapo_jax.objectives.registry import load_objective
from dapo_jax.parallel.host import to_global
from dapo_jax.parallel.mesh import batch_sharding
from dapo_jax.sampling import SamplingConfig, make_generate
from dapo_jax.training.config.sections import OptimSection
from dapo_jax.training.update.programs import make_update
from dapo_jax.training.update.train_step import Batch, init_train_state, make_logprob_fn, make_optimizer


def phase_dapo_step(args, cfg, mesh, graphdef, params, n_params: int) -> dict:
    """Seconds of each stage of one step (after one that compiles), and the step's tokens."""
    gen_p, p, g, s, t = args.gen_prompts, args.prompts, args.group, args.prompt_len, args.train_new_tokens
    if p > gen_p or p % args.minibatches:
        raise ValueError(f"--prompts {p} must be at most --gen-prompts {gen_p} and a multiple of "
                         f"--minibatches {args.minibatches}")
    rng = np.random.default_rng(2)
    prompt_len = rng.integers(s // 2, s + 1, size=gen_p)
    pmask = (np.arange(s)[None] >= s - prompt_len[:, None]).astype(np.int32)  # left-padded
    pids = rng.integers(1, cfg.vocab_size, size=(gen_p, s)).astype(np.int32) * pmask
    adv = rng.choice([-1.0, 1.0], size=(p, g, 1)).astype(np.float32)
    put = lambda x: to_global(x, batch_sharding(mesh))  # noqa: E731
    objective = load_objective("dapo", dynamic_sampling=False, overlong_buffer=None, max_response_length=t)
    optim = OptimSection(lr=1e-6, weight_decay=0.1, grad_clip=1.0, packing=True, micro_batches=args.micro_batches)
    tx, schedule = make_optimizer(optim)
    generate = make_generate(graphdef, SamplingConfig(max_new_tokens=t, temperature=1.0, eos_token_ids=(),
                                                      pad_token_id=0), g)
    logprob = make_logprob_fn(graphdef, temperature=1.0)
    update, share = make_update(graphdef, tx, schedule, objective=objective, optim=optim, temperature=1.0, mesh=mesh,
                                attention=cfg.attention, seq_len=s + t)  # the update as the run builds it
    per_mini = p // args.minibatches

    def step(state, key) -> tuple[object, dict, dict]:
        seconds = {}
        t0 = time.perf_counter()
        rollout = jax.block_until_ready(generate(state.params, *put((pids, pmask)), key))
        seconds["rollout_s"] = time.perf_counter() - t0
        kept = slice(0, p)  # the groups dynamic sampling would keep: any p of them cost the same
        batch_in = (rollout.prompt_ids[kept], rollout.prompt_mask[kept], rollout.response_ids[kept],
                    rollout.response_mask[kept])
        t0 = time.perf_counter()
        old_logp, _ = jax.block_until_ready(logprob(state.params, *batch_in))
        seconds["old_logp_s"] = time.perf_counter() - t0
        mask = batch_in[3].astype(jnp.float32)
        batch = Batch(*batch_in[:3], mask, old_logp, jnp.asarray(adv) * mask, jnp.zeros_like(old_logp))
        t0 = time.perf_counter()
        for m in range(args.minibatches):
            mini = jax.tree.map(lambda x: x[m * per_mini:(m + 1) * per_mini], batch)
            state, metrics = update(state, mini)
        jax.block_until_ready((state, metrics))
        seconds["update_s"] = time.perf_counter() - t0
        return state, seconds, {"lengths": np.asarray(rollout.lengths), "grad_norm": float(metrics["grad_norm"])}

    with jax.set_mesh(mesh):
        state = init_train_state(params, tx)
        t0 = time.perf_counter()
        state, _, _ = step(state, jax.random.key(0))
        first_s = time.perf_counter() - t0
        state, seconds, info = step(state, jax.random.key(1))
    if int(info["lengths"].min()) != t:
        raise RuntimeError(f"a response stopped before {t} tokens: the step would not be the recipe's worst case")
    seconds["step_s"] = sum(seconds.values())
    return dict(params=n_params, gen_sequences=gen_p * g, train_sequences=p * g, new_tokens=t,
                generated_tokens=gen_p * g * t, trained_tokens=int((prompt_len[:p, None] + t).sum() * g),
                first_step_s=first_s, share_prompts=share, grad_norm=info["grad_norm"], **seconds,
                rollout_tokens_per_s=gen_p * g * t / seconds["rollout_s"])

