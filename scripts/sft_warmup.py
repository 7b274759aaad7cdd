"""The bundled base models' supervised warm-up, run by `dapo-jax sft` (docs/stages.md#sft).

    model, stats = sft_warm_up(model, tok, rows, work=DIR, task=..., reward=..., ...)

The makers (`scripts/make_{tiny,cot,countdown}_base.py`) draw their warm-up rows and their randomly
initialised model; this writes the model (`hf_io.save_pretrained`, with the character tokenizer) and the
rows (`{"prompt", "response"}` lines, format `sft`) into `work`, writes a run config for them and runs
`dapo-jax sft` on it: the trainer's own supervised path (training/supervised.py, objectives/supervised.py),
its packed update, data stream, checkpoints and held-out evaluation. The early stop of the makers is
`train.stop_at_accuracy`: the run ends at the first evaluation (every `eval_every` steps, one sample per
held-out problem at temperature 1) whose accuracy reaches the target. Returns the trained model (from the
run's last checkpoint) and the run's figures.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from dapo_jax.cli import main as dapo_jax
from dapo_jax.data.char_tokenizer import save_char_tokenizer
from dapo_jax.models.hf_io import save_pretrained
from dapo_jax.training.build import load_trained_model
from dapo_jax.training.config.run import load_config
from dapo_jax.training.metrics import read_metrics


def warmup_config(*, work: Path, task: dict, reward: str, prompt_len: int, response_len: int, batch: int,
                  lr: float, warmup_steps: int, weight_decay: float, max_steps: int, eval_every: int,
                  eval_size: int, target: float, seed: int) -> dict:
    """The `dapo-jax sft` run config of a warm-up: `task` = the held-out task as `data.eval` names it."""
    return {
        "model": {"path": str(work / "init"), "dtype": "float32", "param_dtype": "float32"},
        "data": {"train": {"name": str(work / "warmup.jsonl"), "format": "sft"}, "eval": task,
                 "eval_size": eval_size, "max_prompt_length": prompt_len, "seed": seed},
        "objective": {"name": "sft"},
        # gen_batch: the evaluation's prompts a call (the run's checks count it as if sampling the train batch)
        "rollout": {"train_batch": batch, "gen_batch": min(eval_size, 200), "max_new_tokens": response_len,
                    "max_gen_batches": max(1, -(-batch // min(eval_size, 200)))},
        "optim": {"lr": lr, "warmup_steps": warmup_steps, "schedule": "constant", "weight_decay": weight_decay,
                  "grad_clip": None, "num_minibatches": 1, "micro_batches": 1},
        "mesh": {"data": 1, "fsdp": 1, "tensor": 1},
        "train": {"steps": max_steps, "seed": seed, "eval_every": eval_every, "eval_k": 1, "eval_temperature": 1.0,
                  "stop_at_accuracy": target, "checkpoint_every": 0, "keep_checkpoints": 1,
                  "run_dir": str(work / "run"), "progress": False, "tensorboard": False, "rollouts_every": 0},
        "reward": {"functions": [{"name": reward}], "on_error": "wrong"},
    }


def sft_warm_up(model, tok, rows: list[dict], *, work: Path, log=print, **config) -> tuple:
    """`(trained model, stats)`: `rows` ({"prompt", "answer"}) trained by `dapo-jax sft` from `model`.
    `config`: `warmup_config`'s keywords. stats: steps, loss (the last step's), sampled_accuracy (the
    last evaluation's eval/accuracy)."""
    work = Path(work)
    (work / "init").mkdir(parents=True, exist_ok=True)
    save_pretrained(model, work / "init")
    save_char_tokenizer(work / "init")
    with open(work / "warmup.jsonl", "w") as f:
        for r in rows:
            f.write(json.dumps({"prompt": r["prompt"], "response": r["answer"]}) + "\n")
    path = work / "warmup.yaml"
    path.write_text(yaml.safe_dump(warmup_config(work=work, **config), sort_keys=False))
    log(f"dapo-jax sft {path}")
    code = dapo_jax(["sft", str(path)])
    if code:
        raise SystemExit(f"dapo-jax sft {path} exited with {code}")
    cfg = load_config(path, [])
    trained, _, step = load_trained_model(cfg, cfg.train.run_dir)
    rows = read_metrics(cfg.train.run_dir)
    losses = [r["loss"] for r in rows if "loss" in r]
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    return trained, {"steps": step, "loss": losses[-1] if losses else float("nan"),
                     "sampled_accuracy": evals[-1] if evals else float("nan")}
