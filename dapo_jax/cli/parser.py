"""The `dapo-jax` argument parser: every sub-command, its options and the function that runs it."""

from __future__ import annotations

import argparse

from dapo_jax.cli.commands import (cmd_eval, cmd_export, cmd_plot, cmd_rft, cmd_sft, cmd_show, cmd_stages,
                                   cmd_train)
from dapo_jax.cli.plan import cmd_plan
from dapo_jax.data.templates import TEMPLATES


class _Parser(argparse.ArgumentParser):
    """Overrides may follow options (`dapo-jax plan CONFIG --topology v5p-64 mesh.fsdp=32`): what argparse
    leaves over after the options, when it is `key=value` words, joins the command's config overrides."""

    def parse_args(self, args=None, namespace=None):
        ns, extra = self.parse_known_args(args, namespace)
        if extra:
            if getattr(ns, "items", None) is None or any("=" not in x or x.startswith("-") for x in extra):
                self.error(f"unrecognized arguments: {' '.join(extra)}")
            ns.items = [*ns.items, *extra]
        return ns


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dapo-jax", description="DAPO / GRPO-family RL post-training in JAX.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("train", help="train (or resume) a run")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key.sub=value",
                   help="a packaged recipe's name (tiny_dapo, ...) or a config file (default: the main job, "
                        "cot_dapo) then dotted overrides")
    p.set_defaults(fn=cmd_train)
    p = sub.add_parser("sft", help="supervised fine-tuning (or resume) on prompt/response or chat data")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key.sub=value",
                   help="a recipe whose objective is sft (default: cot_sft) then dotted overrides")
    p.set_defaults(fn=cmd_sft)
    p = sub.add_parser("rft", help="rejection sampling: a model's correct answers to data.train as an SFT data file")
    p.add_argument("items", nargs="*", metavar="MODEL [key.sub=value]",
                   help="a run dir, RUN_DIR/checkpoints/STEP, a run config or a Hugging Face model dir; overrides")
    p.add_argument("--out", required=True, help="the JSON-lines file of kept responses ({prompt, response, ...})")
    p.add_argument("--k", type=int, help="responses sampled per prompt (default: rollout.G)")
    p.add_argument("--per-prompt", dest="per_prompt", type=int, default=1, help="at most N kept per prompt (default 1)")
    p.add_argument("--limit", type=int, help="the first N prompts of data.train")
    p.add_argument("--checkpoint", type=int, help="the run's checkpoint step (default: the newest; 0 = base model)")
    p.set_defaults(fn=cmd_rft)
    p = sub.add_parser("stages", help="run (or resume) a chain of stages: sft -> dapo -> rft -> dapo, ...")
    p.add_argument("file", help="a stages file (run_dir + stages: [{name, recipe, overrides, rft}]), e.g. "
                   "dapo_jax/configs/stages/cot_r1.yaml")
    p.set_defaults(fn=cmd_stages)
    p = sub.add_parser("eval", help="avg@k, pass@k, maj@k of a base model or a run's checkpoint on data sets",
                       description="Evaluates a Hugging Face model directory, a run (its newest checkpoint or "
                       "--checkpoint STEP; 0 = its base model) or a run config on the run's held-out set or on "
                       "--data files; prints a table, writes a results JSON and the samples of every problem.")
    p.add_argument("items", nargs="*", metavar="[RUN_DIR|CONFIG] [key.sub=value]",
                   help="the old form: a run dir or config, then dotted config overrides (also allowed with --model)")
    p.add_argument("--model", help="a run dir, RUN_DIR/checkpoints/STEP, a run config, or a Hugging Face model dir")
    p.add_argument("--checkpoint", type=int, help="the run's checkpoint step (default: the newest; 0 = base model)")
    p.add_argument("--data", nargs="+", action="extend", metavar="[NAME=]PATH",
                   help="data files (GSM8K, MATH-500, AIME, AMC23, DAPO-Math, ...); default: the run's data.eval")
    p.add_argument("--format", help="the data's row format when its name/path does not tell (gsm8k, math500, aime, "
                   "amc, dapo_math, custom, ...)")
    p.add_argument("--template", choices=list(TEMPLATES),
                   help="prompt template for --data (default: the run's; a HF model: chat if it has a chat template)")
    p.add_argument("--prompt-field", dest="prompt_field",
                   help="the --data rows' prompt field, dotted (as data.*.prompt_field in a run config)")
    p.add_argument("--answer-field", dest="answer_field",
                   help="the --data rows' answer field, dotted (as data.*.answer_field in a run config)")
    p.add_argument("--reward", help="the reward that judges responses (default: the format's, see README)")
    p.add_argument("--k", type=int, help="samples per problem (default: the run's train.eval_k)")
    p.add_argument("--temperature", type=float, help="0 = greedy (default: the run's train.eval_temperature)")
    p.add_argument("--top-p", dest="top_p", type=float)
    p.add_argument("--top-k", dest="top_k", type=int)
    p.add_argument("--max-new-tokens", dest="max_new_tokens", type=int)
    p.add_argument("--max-prompt-length", dest="max_prompt_length", type=int,
                   help="default: the run's for its own set; the longest prompt for --data")
    p.add_argument("--batch-size", dest="batch_size", type=int, help="prompts per batch (default: rollout.gen_batch)")
    p.add_argument("--seed", type=int, help="default: the run's train.seed (the same key as its evaluation)")
    p.add_argument("--limit", type=int, help="the first N problems of each set")
    p.add_argument("--out", help="results JSON (default RUN_DIR/eval/step_N.json or eval_results/MODEL.json); "
                   "samples go beside it as OUT.NAME.samples.jsonl")
    p.set_defaults(fn=cmd_eval)
    p = sub.add_parser("export", help="write a checkpoint as a Hugging Face model directory with its tokenizer")
    p.add_argument("checkpoint", help="a run dir, its checkpoints/ folder, or checkpoints/STEP")
    p.add_argument("out_dir")
    p.add_argument("--peft", action="store_true", help="a LoRA run: write its adapter in PEFT's format "
                   "(adapter_config.json + adapter_model.safetensors) instead of the merged model")
    p.set_defaults(fn=cmd_export)
    p = sub.add_parser("show", help="what the model wrote: a step's logged rollouts with rewards and advantages")
    p.add_argument("run_dir")
    p.add_argument("step", nargs="?", type=int, help="a logged step (default: the newest; see RUN_DIR/rollouts/)")
    p.add_argument("--groups", type=int, help="show only the first N groups")
    p.add_argument("--width", type=int, default=300, help="cut texts to N characters (0 = whole)")
    p.add_argument("--plain", action="store_true", help="plain text even when rich is installed")
    p.set_defaults(fn=cmd_show)
    p = sub.add_parser("plot", help="PNG curves of a run's metrics.jsonl")
    p.add_argument("run_dir")
    p.add_argument("--out", default=None, help="output folder (default RUN_DIR/plots)")
    p.set_defaults(fn=cmd_plot)
    p = sub.add_parser("plan", help="will it fit? per-device memory of each phase from the run's compiled programs",
                       description="Compiles the run's programs ahead of time (no weights, nothing runs) for this "
                       "machine or a TPU slice by name, and prints per-device memory by phase against the chip's. "
                       "Exit 0: it fits; 3: a phase does not; 2: a user error. Options and overrides in any order.")
    p.add_argument("items", nargs="*", metavar="[CONFIG.yaml] key.sub=value")
    p.add_argument("--topology", metavar="SLICE", help="a TPU slice (v4-8, v5e-4 .. v5e-256, v5litepod-N, v5p-8 .. "
                   "v5p-6144, v6e-N, tpu7x-N; 2xv5p-64 = two slices), or a family (v5p) to search its sizes; "
                   "needs libtpu: pip install 'dapo_jax[tpu]'")
    p.add_argument("--search", action="store_true", help="the smallest slice of the --topology family that fits, "
                   "over its sizes and the data x fsdp x tensor meshes that divide the batch and the heads")
    p.add_argument("--model-config", dest="model_config", metavar="config.json",
                   help="the model's shapes (default: model.path's config.json, else the published shape its name names)")
    p.add_argument("--no-fit", dest="no_fit", action="store_true", help="when the run does not fit, do not search "
                   "for the smallest change that makes it fit (more micro-batches, smaller packed chunks, remat, "
                   "another mesh: each compiled as a plan of its own, training/plan/fit.py)")
    p.add_argument("--exact", action="store_true", help="compile every layer (default: a model of more than 3 layers "
                   "is compiled at 2 and 3 and extrapolated per layer)")
    p.add_argument("--only", action="append", metavar="PROGRAM", help="compile only the programs whose names start "
                   "so (rollout, 'eval rollout', prepare, update; repeatable), e.g. one rollout with --exact")
    p.add_argument("--device-memory", dest="device_memory", type=float, metavar="GiB",
                   help="memory per device (default: the slice's usable HBM; the device's memory_stats(); on CPU the "
                   "host RAM / devices)")
    p.add_argument("--cpu-devices", dest="cpu_devices", type=int, metavar="N", help="N virtual CPU devices for the mesh")
    p.add_argument("--response-tokens", dest="response_tokens", type=int, metavar="T",
                   help="mean response length for the step-time estimate (default: rollout.max_new_tokens)")
    p.add_argument("--mfu", type=float, default=1.0, help="the fraction of the bf16 peak the estimate assumes (default 1.0)")
    p.add_argument("--json", nargs="?", const="-", metavar="FILE", help="write the plan as JSON (bytes) to FILE; "
                   "alone: print JSON instead of the table")
    p.add_argument("--no-cache", dest="no_cache", action="store_true", help="compile again what an earlier plan compiled")
    p.add_argument("--quiet", action="store_true", help="no progress lines on stderr")
    p.set_defaults(fn=cmd_plan)
    return parser
