"""TRL's GRPOTrainer on the `benchmarks.peers` workload (run by it in a subprocess; prints the result line).

    python -m benchmarks.peers_trl --model-dir DIR --workload '{"prompts": 8, ...}' --size 5m

DAPO in TRL's terms: loss_type="dapo" (token mean over the global batch), epsilon 0.2 / epsilon_high
0.28, beta 0 (no reference model), scale_rewards="group", num_iterations 1, one optimizer step per
generation batch (per_device_train_batch_size = prompts * G, no gradient accumulation), constant LR,
AdamW without weight decay, max_grad_norm 1, no gradient checkpointing (TRL turns it on by default;
our side does not recompute either), top_k 0 / top_p 1 / temperature 1, eager torch on CPU
(fp32), no logging (logging_steps larger than the run), no saving, no eval.

Timings: a step is the Trainer's on_step_begin -> on_step_end (generation happens inside it);
generate = the time inside `_generate_single_turn` (transformers `generate`); host = the rest of
`_generate_and_score_completions` (decoding, rewards, advantages); update = step - those two.
"""

from __future__ import annotations

import tempfile
import time

from benchmarks.workload import emit, peer_args, prompt_texts, reward, summarize


def main(argv=None) -> int:
    args, w = peer_args(argv)

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    torch.manual_seed(w.seed)
    tok = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir, dtype=torch.float32)
    ds = Dataset.from_dict({"prompt": prompt_texts(w)})

    def reward_fn(completions, **_):
        return [reward(c) for c in completions]

    with tempfile.TemporaryDirectory() as out:
        config = GRPOConfig(
            output_dir=out, per_device_train_batch_size=w.prompts * w.G, gradient_accumulation_steps=1,
            num_generations=w.G, max_completion_length=w.max_new_tokens, temperature=w.temperature, top_p=1.0,
            top_k=0, learning_rate=w.lr, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0,
            max_grad_norm=1.0, beta=0.0, epsilon=w.eps_low, epsilon_high=w.eps_high, loss_type="dapo",
            scale_rewards="group", num_iterations=1, max_steps=w.steps, logging_steps=10 ** 6, report_to="none",
            save_strategy="no", eval_strategy="no", use_cpu=True, bf16=False, fp16=False, seed=w.seed,
            shuffle_dataset=False, log_completions=False, dataloader_num_workers=0,
            mask_truncated_completions=False, disable_tqdm=True, gradient_checkpointing=False,
        )
        trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=config, train_dataset=ds,
                              processing_class=tok)
        gen_s, score_s, step_s, seqs, lengths = [], [], [], [], []
        generate, score = trainer._generate_single_turn, trainer._generate_and_score_completions

        def timed_generate(prompt_ids, *a, **k):
            t0 = time.perf_counter()
            completion_ids, logprobs = generate(prompt_ids, *a, **k)
            gen_s.append(time.perf_counter() - t0)
            lengths.append([len(c) for c in completion_ids])
            seqs.append([len(p) + len(c) for p, c in zip(prompt_ids, completion_ids)])
            return completion_ids, logprobs

        def timed_score(*a, **k):
            t0 = time.perf_counter()
            out = score(*a, **k)
            score_s.append(time.perf_counter() - t0)
            return out

        trainer._generate_single_turn = timed_generate
        trainer._generate_and_score_completions = timed_score

        class Timer(TrainerCallback):
            def on_step_begin(self, *a, **k):
                self.t0 = time.perf_counter()

            def on_step_end(self, *a, **k):
                step_s.append(time.perf_counter() - self.t0)

        trainer.add_callback(Timer())
        trainer.train()

    if not (len(step_s) == len(gen_s) == len(score_s) == w.steps):
        raise RuntimeError(f"expected {w.steps} steps with one generation each, got {len(step_s)} steps, "
                           f"{len(gen_s)} generations, {len(score_s)} scorings")
    update_s = [s - c for s, c in zip(step_s, score_s)]
    host_s = [c - g for c, g in zip(score_s, gen_s)]
    res = summarize(step_s, gen_s, update_s, lengths, warmup=w.warmup_steps, host_s=host_s)
    res.update(framework=f"TRL {trl.__version__} GRPOTrainer", seq_lengths_per_step=seqs[w.warmup_steps:],
               update_s_all=update_s[w.warmup_steps:], compilations_after_step1=None,
               versions={"trl": trl.__version__, "transformers": transformers.__version__,
                         "torch": torch.__version__}, torch_threads=torch.get_num_threads())
    emit(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
