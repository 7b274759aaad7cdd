"""`dapo-jax`: train, evaluate, export, show rollouts and plot.

    dapo-jax train [RECIPE|CONFIG.yaml] [key.sub=value ...]  # no config = the main job, cot_dapo; rerun = resume
    dapo-jax sft [RECIPE|CONFIG.yaml] [key.sub=value ...]    # supervised fine-tuning (default cot_sft); same loop
    dapo-jax rft MODEL --out kept.jsonl [--k 8] [--per-prompt 2]   # rejection sampling into an SFT file
    dapo-jax stages STAGES.yaml                         # sft -> dapo -> rft -> dapo ... as one run; rerun = resume
    dapo-jax eval --model RUN_OR_HF_DIR [--data F ...]  # avg@k, pass@k, maj@k; table + results JSON + samples
    dapo-jax eval RUN_DIR [key.sub=value ...]           # the same, old form: the run's newest checkpoint
    dapo-jax export CHECKPOINT OUT_DIR [--peft]         # Hugging Face model + tokenizer (--peft: LoRA adapter)
    dapo-jax show RUN_DIR [STEP]                        # the logged rollouts: prompts, responses, rewards
    dapo-jax plot RUN_DIR                               # PNG curves into RUN_DIR/plots
    dapo-jax plan [CONFIG.yaml] [key=value ...] [--topology v5p-64]  # will it fit? exit 0 yes, 3 no

This module is the process's entry point (the `dapo-jax` console script, `python -m dapo_jax.cli`): it
quiets the imports, parses the command line (cli/parser.py), runs the command (cli/commands.py,
cli/plan.py) and maps what it raises to the exit code (`main`).
"""

from __future__ import annotations

import logging
import os
import sys


class _NoTorchBanner(logging.Filter):
    """transformers says "PyTorch was not found..." when it is imported without torch: this project's models
    are JAX, it only reads tokenizers and configs with transformers, so the line would only alarm. Every
    other transformers message passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("PyTorch was not found")


logging.getLogger("transformers").addFilter(_NoTorchBanner())  # before anything imports transformers

from dapo_jax import startup  # noqa: E402

startup.prepare()  # SIGTERM / SIGHUP during the imports below: one line; libtpu quiet without a TPU

from dapo_jax.cli.parser import build_parser  # noqa: E402
from dapo_jax.cli.plan import prepare_plan  # noqa: E402
from dapo_jax.training.config.base import ConfigError  # noqa: E402
from dapo_jax.training.rollout import StarvationError  # noqa: E402
from dapo_jax.training.sources import DataError  # noqa: E402


def _user_errors() -> tuple[type[BaseException], ...]:
    """What the user must fix (exit code 2): bad config, data, model or checkpoint files, mesh."""
    from dapo_jax.models.config import ModelConfigError
    from dapo_jax.models.safetensors_files import CheckpointError as ModelCheckpointError
    from dapo_jax.parallel.mesh import MeshError
    from dapo_jax.training.state.checkpoint_errors import CheckpointError

    return (ConfigError, DataError, ModelCheckpointError, ModelConfigError, CheckpointError, MeshError,
            FileNotFoundError, NotADirectoryError, IsADirectoryError, PermissionError)


def main(argv: list[str] | None = None) -> int:
    """Exit codes: 0 done; 2 a user error (one line naming the key, file or row); 3 dynamic sampling
    starved, or `plan`: the run does not fit; 4 non-finite updates kept coming; 6 a checkpoint could not
    be saved; 7 another process of a multi-process run is gone; 143 stopped by SIGTERM after saving a
    checkpoint (or before the first step, with nothing to save); 130 stopped by Ctrl-C (SIGINT), the same
    way (a second Ctrl-C, or one outside training: at once, without saving)."""
    from dapo_jax.training.state.guards import INTERRUPTED_EXIT_CODE
    from dapo_jax.parallel.stopped import RunStopped

    argv = sys.argv[1:] if argv is None else argv
    flag = next((a for a in argv[1:] if a.split("=", 1)[0] in ("--config", "--config-name", "--config-path")), None)
    if argv and argv[0] in ("train", "eval", "plan") and flag is not None:  # verl's / Hydra's way of naming it
        print(f"dapo-jax: ConfigError: {flag.split('=', 1)[0]}: the config is the first argument, as a recipe name or a "
              f"path: dapo-jax {argv[0]} CONFIG.yaml key.sub=value ...", file=sys.stderr)
        return 2
    args = build_parser().parse_args(argv)
    if args.command in ("train", "sft", "rft", "stages", "eval"):  # a rerun or resume reads its compiled programs back (compile_cache.py)
        from dapo_jax.compile_cache import enable_compilation_cache

        enable_compilation_cache()
    try:
        if args.command == "plan":
            prepare_plan(args)
        return args.fn(args)
    except StarvationError as e:
        print(f"dapo-jax: {e}", file=sys.stderr)
        return 3
    except RunStopped as e:
        print(f"dapo-jax: {type(e).__name__}: {e}", file=sys.stderr)
        if e.abandon_saves:  # a failed save or a lost peer: nothing left that could complete is waited for
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(e.exit_code)
        return e.exit_code
    except _user_errors() as e:
        print(f"dapo-jax: {type(e).__name__}: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C outside a run's steps, or twice during one (training/state/guards.py)
        print("dapo-jax: Interrupted: Ctrl-C: stopped without saving; rerun the same command to start or resume "
              "(from the last checkpoint)", file=sys.stderr)
        return INTERRUPTED_EXIT_CODE
