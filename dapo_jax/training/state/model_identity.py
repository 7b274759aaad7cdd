"""What identifies the run's model, recorded when the run starts and compared on every resume.

    check_model_unchanged(cfg, run_dir, say)   # before the model loads: ConfigError (exit 2) on a change
    record_model(cfg, run_dir)                 # once the run really starts: RUN_DIR/model.json

A resume restores the trained parameters from the checkpoint, but the rest of the model is read again from
`model.path`: the tokenizer (token ids of every prompt and answer), `config.json` and
`generation_config.json` (stop tokens), and the base weights (a LoRA run's frozen weights, the reference
policy of a KL objective). Any of them edited in place between a run and its resume would give another
trajectory under the same run dir, silently; so their digests are kept in `RUN_DIR/model.json` and a
resume on a change stops with one line naming the file, unless `model.accept_changed=true` (then the line
is a warning and the new digests are recorded).

How it stays cheap for large checkpoints: the small files (tokenizer, configs, the safetensors index)
are hashed whole (SHA-256). A weight file is hashed by its safetensors header (every tensor's name,
dtype, shape and offsets) and the first and last `WINDOW` bytes of every tensor's data: other weights of
the same shapes differ in those bytes (a fine-tune, a merged adapter or another checkpoint changes every
element of the tensors it touches), and the read is a few MiB whatever the checkpoint's size (about
770 tensors x 8 KiB for a 32B model) instead of the whole file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import resolve_path
from dapo_jax.training.config.run import RunConfig

RECORD = "model.json"
WINDOW = 4096  # bytes hashed at each end of every tensor
# the files besides the weights that decide what the model computes and how text becomes token ids
SMALL_FILES = ("config.json", "generation_config.json", "model.safetensors.index.json", "tokenizer.json",
               "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt", "merges.txt",
               "special_tokens_map.json", "added_tokens.json", "chat_template.jinja", "chat_template.json")


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def weights_digest(path: Path, *, window: int = WINDOW) -> str:
    """SHA-256 of a safetensors file's header and the first and last `window` bytes of each tensor."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        raw_n = f.read(8)
        (n,) = np.frombuffer(raw_n, "<u8") if len(raw_n) == 8 else (0,)
        header_bytes = f.read(int(n))
        h.update(raw_n + header_bytes)
        try:
            header = json.loads(header_bytes)
        except ValueError:  # not a safetensors file: its first bytes stand for it (the loader names the fault)
            return h.hexdigest()
        spans = sorted(tuple(e["data_offsets"]) for e in header.values() if isinstance(e, dict) and "data_offsets" in e)
        for start, end in spans:
            start, end = 8 + int(n) + int(start), 8 + int(n) + int(end)
            f.seek(start)
            h.update(f.read(min(window, end - start)))
            if end - start > window:
                f.seek(max(start + window, end - window))
                h.update(f.read(end - max(start + window, end - window)))
    return h.hexdigest()


def model_identity(path: str | Path) -> dict[str, str]:
    """`{file name: digest}` of the model folder: the small files whole, each `*.safetensors` by
    `weights_digest`. A file absent from the folder is absent from the result."""
    root = Path(path)
    out = {name: _sha256_file(root / name) for name in SMALL_FILES if (root / name).is_file()}
    out.update({p.name: weights_digest(p) for p in sorted(root.glob("*.safetensors"))})
    return out


def _changes(old: dict[str, str], new: dict[str, str]) -> list[str]:
    names = sorted(old.keys() | new.keys())
    return [f"{n} {'added' if n not in old else 'removed' if n not in new else 'changed'}" for n in names
            if old.get(n) != new.get(n)]


def _has_checkpoint(run_dir: Path) -> bool:
    folder = run_dir / "checkpoints"
    return folder.is_dir() and any(p.name.isdigit() for p in folder.iterdir())


def check_model_unchanged(cfg: RunConfig, run_dir: str | Path, say=print) -> None:
    """On a resume (a checkpoint in `run_dir` and its `model.json`), raises `ConfigError` naming each file
    of `model.path` that changed since the run started, unless `model.accept_changed` (then warns)."""
    run_dir = Path(run_dir)
    record = run_dir / RECORD
    if not record.is_file() or not _has_checkpoint(run_dir):
        return
    old = json.loads(record.read_text())["files"]
    path = resolve_path(cfg.model.path)
    changed = _changes(old, model_identity(path))
    if not changed:
        return
    what = "; ".join(changed[:6])
    if not cfg.model.accept_changed:
        raise ConfigError(f"model.path: {path}: {what} since the run in {run_dir} started (its checkpoints were "
                          f"trained with the recorded files, {record}): restore them, use a new train.run_dir, or "
                          f"set model.accept_changed=true to resume on them anyway")
    say(f"[dapo-jax] warning: resuming on a changed model (model.accept_changed=true): {path}: {what}", flush=True)


def record_model(cfg: RunConfig, run_dir: str | Path) -> Path:
    """Writes `run_dir/model.json`: `model.path`'s digests, when the run starts or after an accepted change."""
    path = resolve_path(cfg.model.path)
    out = Path(run_dir) / RECORD
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"path": str(path.absolute()), "files": model_identity(path)}, indent=1) + "\n")
    tmp.replace(out)
    return out


__all__ = ["RECORD", "WINDOW", "check_model_unchanged", "model_identity", "record_model", "weights_digest"]
