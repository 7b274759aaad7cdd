"""Safetensors files (dapo_jax/models/safetensors_files.py): a missing shard or weights file and a truncated one
are one error naming the file; written files get the mode any other file gets under the umask."""

import json
import os

import numpy as np
import pytest

from dapo_jax.models.hf_io import load_pretrained, save_pretrained
from dapo_jax.models.safetensors_files import (SAFETENSORS_INDEX, CheckpointError, SafetensorsFile,
                                               checkpoint_tensor_names, save_safetensors)
from tests.models.test_hf_io import hf_model, load_pretrained_from_hf


def test_error_missing_shard(tmp_path):
    model = load_pretrained_from_hf(tmp_path)
    save_pretrained(model, tmp_path / "s", max_shard_bytes=20_000)
    index = json.loads((tmp_path / "s" / SAFETENSORS_INDEX).read_text())
    victim_name, victim_file = next(iter(index["weight_map"].items()))
    (tmp_path / "s" / victim_file).unlink()
    with pytest.raises(CheckpointError, match=rf"shard file .*{victim_file}.*{victim_name}.*missing"):
        load_pretrained(tmp_path / "s")


def test_error_no_weights_file(tmp_path):
    hf_model("llama", False).config.to_json_file(tmp_path / "config.json")
    with pytest.raises(CheckpointError, match="no model.safetensors"):
        load_pretrained(tmp_path)


def test_saved_weights_have_the_mode_of_any_written_file(tmp_path):
    """safetensors creates its files 0600; an export others serve or copy must be readable as the umask says."""
    old = os.umask(0o022)
    try:
        save_pretrained(load_pretrained(_saved_tiny(tmp_path)), tmp_path / "out", max_shard_bytes=20_000)
        save_safetensors({"w": np.ones(3, np.float32)}, tmp_path / "one.safetensors")
        os.umask(0o027)
        save_safetensors({"w": np.ones(3, np.float32)}, tmp_path / "group.safetensors")
    finally:
        os.umask(old)
    files = [*(tmp_path / "out").glob("*.safetensors"), tmp_path / "one.safetensors"]
    assert len(files) > 2 and {oct(f.stat().st_mode & 0o777) for f in files} == {"0o644"}
    assert oct((tmp_path / "group.safetensors").stat().st_mode & 0o777) == "0o640"


def _saved_tiny(tmp_path):
    ref = hf_model("qwen2", False, seed=2)
    ref.save_pretrained(tmp_path / "hf")
    return tmp_path / "hf"


def test_a_truncated_file_names_itself_and_the_size_its_header_needs(tmp_path):
    save_safetensors({"w": np.arange(6, dtype=np.float32).reshape(2, 3)}, tmp_path / "model.safetensors")
    f = SafetensorsFile(tmp_path / "model.safetensors")
    np.testing.assert_array_equal(f.array("w"), np.arange(6, dtype=np.float32).reshape(2, 3))
    assert checkpoint_tensor_names(tmp_path) == ["w"]
    data = (tmp_path / "model.safetensors").read_bytes()
    (tmp_path / "model.safetensors").write_bytes(data[:-4])  # the last float's bytes gone
    with pytest.raises(CheckpointError, match=rf"model\.safetensors is truncated: {len(data) - 4} bytes, but its "
                                              rf"header needs {len(data)}"):
        SafetensorsFile(tmp_path / "model.safetensors")
