"""Tunix's DAPOLearner on the `benchmarks.peers` workload (run by it in a subprocess; prints the result line).

    python -m benchmarks.peers_tunix --model-dir DIR --workload '{"prompts": 8, ...}' --size 5m

The model is loaded by Tunix's own Qwen2 safetensors loader (`tunix.models.qwen2.params`) with the
shape of config.json; rollouts by its "vanilla" engine (its JAX KV-cache sampler) on the same one-device
mesh as the actor. DAPO in Tunix's terms: `DAPOConfig` with num_generations G, num_iterations 1,
epsilon 0.2 / epsilon_high 0.28, token-mean loss, no KL (beta None), dynamic sampling off, overlong
shaping off (overlong_buffer None); one mini-batch (= the whole batch) per step, AdamW (no weight
decay) after grad-norm clipping at 1, constant LR; no eval, no checkpoints, no metrics logger.

Timings: a step = `_run_global_step` + the weight sync after it; generate = `RLCluster.generate`;
update = `RLCluster.update_actor`; host = the rest (tokenising, rewards, advantages, the sync).
Compilations after step 1 are counted with the same jax.monitoring event as dapo_jax's.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from benchmarks.workload import emit, peer_args, prompt_texts, reward, summarize


def main(argv=None) -> int:
    args, w = peer_args(argv)

    import importlib.metadata

    import jax
    import numpy as np
    import optax
    from transformers import AutoTokenizer
    from tunix.models.qwen2 import model as qwen2_model
    from tunix.models.qwen2 import params as qwen2_params
    from tunix.rl import rl_cluster as rl_cluster_lib
    from tunix.rl.grpo.dapo_learner import DAPOConfig, DAPOLearner
    from tunix.rl.rollout import base_rollout

    compiles = [0]
    jax.monitoring.register_event_duration_secs_listener(
        lambda event, duration, **_: compiles.__setitem__(0, compiles[0] + (
            event == "/jax/core/compile/backend_compile_duration")))

    hf = json.loads((Path(args.model_dir) / "config.json").read_text())
    cfg = qwen2_model.ModelConfig(
        num_layers=hf["num_hidden_layers"], vocab_size=hf["vocab_size"], embed_dim=hf["hidden_size"],
        hidden_dim=hf["intermediate_size"], num_heads=hf["num_attention_heads"], head_dim=hf["head_dim"],
        num_kv_heads=hf["num_key_value_heads"], rope_theta=int(hf["rope_theta"]), norm_eps=hf["rms_norm_eps"],
        use_tied_embedding=hf["tie_word_embeddings"],
    )
    auto = jax.sharding.AxisType.Auto  # Tunix shards by annotation (jax 0.10 makes Explicit axes by default)
    mesh = jax.make_mesh((1, 1), ("fsdp", "tp"), axis_types=(auto, auto))
    with jax.set_mesh(mesh):
        actor = qwen2_params.create_model_from_safe_tensors(args.model_dir, cfg, mesh)
        reference = qwen2_params.create_model_from_safe_tensors(args.model_dir, cfg, mesh)
    tok = AutoTokenizer.from_pretrained(args.model_dir)

    optimizer = optax.chain(optax.clip_by_global_norm(1.0),
                            optax.adamw(w.lr, b1=0.9, b2=0.999, eps=1e-8, weight_decay=0.0))
    training = rl_cluster_lib.RLTrainingConfig(
        actor_optimizer=optimizer, eval_every_n_steps=10 ** 6, max_steps=w.steps,
        mini_batch_size=w.prompts, train_micro_batch_size=w.prompts,
    )
    rollout = base_rollout.RolloutConfig(
        max_tokens_to_generate=w.max_new_tokens, max_prompt_length=w.max_prompt_length,
        kv_cache_size=w.max_prompt_length + w.max_new_tokens + 8, temperature=w.temperature, top_p=1.0,
        top_k=None, eos_tokens=[tok.eos_token_id],
    )
    roles = {rl_cluster_lib.Role.ACTOR: mesh, rl_cluster_lib.Role.REFERENCE: mesh, rl_cluster_lib.Role.ROLLOUT: mesh}
    cluster = rl_cluster_lib.RLCluster(
        actor=actor, reference=reference, tokenizer=tok,
        cluster_config=rl_cluster_lib.ClusterConfig(role_to_mesh=roles, rollout_engine="vanilla",
                                                    offload_to_cpu=False, training_config=training,
                                                    rollout_config=rollout),
    )
    algo = DAPOConfig(num_generations=w.G, num_iterations=1, epsilon=w.eps_low, epsilon_high=w.eps_high,
                      dynamic_sampling=False, overlong_buffer=None)

    def reward_fn(prompts, completions, **_):
        return [reward(c) for c in completions]

    learner = DAPOLearner(rl_cluster=cluster, algo_config=algo, reward_fns=[reward_fn])

    gen_s, upd_s, step_s, sync_s, lengths, seqs = [], [], [], [], [], []
    compiles_after_1 = []

    def timed(fn, out, after=None):
        def wrapper(*a, **k):
            t0 = time.perf_counter()
            res = fn(*a, **k)
            out.append(time.perf_counter() - t0)
            if after is not None:
                after(res)
            return res
        return wrapper

    def record(rollout_output):
        lens = [len(t) for t in rollout_output.tokens]  # Tunix's completion tokens stop BEFORE the EOS
        lengths.append([n + 1 if n < w.max_new_tokens else n for n in lens])  # EOS included, as the others count
        prompt_lens = [int((row != tok.pad_token_id).sum()) for row in rollout_output.left_padded_prompt_tokens]
        seqs.append([p + n for p, n in zip(prompt_lens, lens)])  # what its update trains on

    def step_done(_):
        if len(step_s) == 1 and not compiles_after_1:
            compiles_after_1.append(compiles[0])

    generate = cluster.generate

    def generate_str(*a, prompts, **k):  # numpy string scalars -> str for the HF tokenizer
        return generate(*a, prompts=[str(p) for p in prompts], **k)

    cluster.generate = timed(generate_str, gen_s, record)
    cluster.update_actor = timed(cluster.update_actor, upd_s)
    cluster.sync_weights = timed(cluster.sync_weights, sync_s)
    learner._run_global_step = timed(learner._run_global_step, step_s, step_done)

    texts = prompt_texts(w)
    # batches as Tunix's data pipeline makes them: arrays (it repeats every leaf G times along axis 0)
    dataset = [{"prompts": np.asarray(texts[i * w.prompts:(i + 1) * w.prompts])} for i in range(w.steps)]
    learner.train(dataset)

    if not (len(step_s) == len(gen_s) == len(upd_s) == w.steps):
        raise RuntimeError(f"expected {w.steps} steps, got {len(step_s)} steps, {len(gen_s)} generations, "
                           f"{len(upd_s)} updates")
    if sync_s:  # the weight sync after each step is part of it
        step_s = [s + y for s, y in zip(step_s, sync_s + [0.0] * (len(step_s) - len(sync_s)))]
    res = summarize(step_s, gen_s, upd_s, lengths, warmup=w.warmup_steps)
    res.update(framework=f"Tunix {importlib.metadata.version('google-tunix')} DAPOLearner",
               seq_lengths_per_step=seqs[w.warmup_steps:], update_s_all=upd_s[w.warmup_steps:],
               compilations_after_step1=compiles[0] - compiles_after_1[0] if compiles_after_1 else None,
               length_note="completion tokens exclude the EOS in Tunix; mean_length adds it back where a response stopped",
               versions={"google-tunix": importlib.metadata.version("google-tunix"), "jax": jax.__version__,
                         "flax": importlib.metadata.version("flax")})
    emit(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
