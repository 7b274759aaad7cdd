"""training/state/model_identity.py: the digests of `model.path` recorded when a run starts, and a resume on files
edited in place refused in one line (exit 2) unless `model.accept_changed=true` (issue 47 item 2)."""

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import save_file

from dapo_jax.cli import main
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.state.model_identity import model_identity, weights_digest
from tests.training.conftest import make_tiny_model


def reference_digest(path: Path, window: int) -> str:
    """The same digest, written from the file's bytes in memory: the 8-byte length, the header, then each
    tensor's first and last `window` bytes (the whole tensor when it is at most 2 * window)."""
    raw = path.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    parts = [raw[:8 + n]]
    for start, end in sorted(tuple(e["data_offsets"]) for k, e in header.items() if k != "__metadata__"):
        data = raw[8 + n + start:8 + n + end]
        parts.append(data if len(data) <= 2 * window else data[:window] + data[-window:])
    return hashlib.sha256(b"".join(parts)).hexdigest()


def test_weights_digest_equals_the_reference_and_sees_each_tensor(tmp_path):
    rng = np.random.default_rng(0)
    tensors = {"a": rng.normal(size=(64, 16)).astype(np.float32), "b": np.ones(3, np.float32),
               "c": rng.normal(size=(5,)).astype(np.float32)}
    file = tmp_path / "w.safetensors"
    save_file(tensors, str(file), metadata={"format": "np"})
    for window in (8, 64, 4096):
        assert weights_digest(file, window=window) == reference_digest(file, window)
    before = weights_digest(file, window=64)
    for name in tensors:  # any tensor's values replaced by others of the same shape
        changed = dict(tensors, **{name: tensors[name][::-1].copy() + 1})
        save_file(changed, str(file), metadata={"format": "np"})
        assert weights_digest(file, window=64) != before, name
    save_file({"a": tensors["c"], "b": tensors["b"], "c": tensors["a"][:5, :1].ravel()}, str(file))
    assert weights_digest(file, window=64) != before  # names moved between tensors: the header differs


def test_identity_names_the_small_files_whole_and_each_weight_file(tmp_path):
    make_tiny_model(tmp_path)
    ident = model_identity(tmp_path)
    assert set(ident) >= {"config.json", "tokenizer.json", "model.safetensors"}
    assert ident["tokenizer.json"] == hashlib.sha256((tmp_path / "tokenizer.json").read_bytes()).hexdigest()
    (tmp_path / "README.md").write_text("notes")  # not part of the model
    assert model_identity(tmp_path) == ident


def run(overrides, capsys):
    capsys.readouterr()
    rc = main(["train", "tiny_dapo", *overrides])
    out, err = capsys.readouterr()
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("dapo-jax:")]
    return rc, lines, out


def swap_two_token_ids(tokenizer_json: Path) -> None:
    """Edits the tokenizer in place: the ids of "1" and "2" exchanged (the same vocabulary size)."""
    tok = json.loads(tokenizer_json.read_text())
    vocab = tok["model"]["vocab"]
    vocab["1"], vocab["2"] = vocab["2"], vocab["1"]
    tokenizer_json.write_text(json.dumps(tok))


def test_a_resume_on_a_model_folder_edited_in_place_is_refused_unless_accepted(tmp_path, overrides_for, capsys):
    model_dir = make_tiny_model(tmp_path / "model")
    other = make_tiny_model(tmp_path / "other", seed=1)  # other weights of the same shapes
    run_dir = tmp_path / "run"
    args = lambda steps, *extra: [*overrides_for(model_dir, run_dir), f"train.steps={steps}", *extra]  # noqa: E731
    rc, lines, _ = run(args(1), capsys)
    assert rc == 0, lines
    recorded = json.loads((run_dir / "model.json").read_text())["files"]
    assert recorded == model_identity(model_dir)

    swap_two_token_ids(model_dir / "tokenizer.json")
    rc, lines, _ = run(args(2), capsys)
    assert rc == 2 and len(lines) == 1, lines
    assert lines[0].startswith(f"dapo-jax: ConfigError: model.path: {model_dir}: tokenizer.json changed since the run")
    assert "model.accept_changed=true" in lines[0]
    assert [r["step"] for r in read_metrics(run_dir) if "loss" in r] == [1]  # nothing trained on it

    rc, lines, out = run(args(2, "model.accept_changed=true"), capsys)
    assert rc == 0, lines
    assert "resuming on a changed model (model.accept_changed=true)" in out and "tokenizer.json changed" in out
    assert "resumed from step 1" in out

    shutil.copyfile(other / "model.safetensors", model_dir / "model.safetensors")  # a base model swapped in place
    rc, lines, _ = run(args(3), capsys)
    assert rc == 2 and len(lines) == 1 and "model.safetensors changed" in lines[0], lines
    assert "tokenizer.json" not in lines[0]  # the accepted change was recorded
