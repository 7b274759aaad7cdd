"""Classifier folders in and out (dapo_jax/models/hf_classifier_io.py): the Qwen2.5-Math-PRM head layout read
without remote code, our export loaded by transformers with the same scores, and the one-line refusals of a
model without a score head or with a config listing other labels than its head has."""

import json

import jax.numpy as jnp
import numpy as np
import pytest
import torch
import transformers

from dapo_jax.models.classifier import sequence_logits
from dapo_jax.models.hf_classifier_io import load_classifier, save_classifier
from dapo_jax.models.safetensors_files import CheckpointError
from tests.models.test_classifier import ATOL, PAD, TINY, batch, hf_classifier, ours, spread


class TinyPRM(transformers.Qwen2PreTrainedModel):
    """The Qwen2.5-Math-PRM layout written out here (its own class is remote code): the Qwen2 trunk and
    `score = Sequential(Linear(d, d), ReLU, Linear(d, 2))`, read at every position."""

    def __init__(self, config):
        super().__init__(config)
        self.model = transformers.Qwen2Model(config)
        d = config.hidden_size
        self.score = torch.nn.Sequential(torch.nn.Linear(d, d), torch.nn.ReLU(), torch.nn.Linear(d, 2))
        self.post_init()

    def forward(self, input_ids, attention_mask=None):
        return self.score(self.model(input_ids, attention_mask=attention_mask).last_hidden_state)


def test_qwen_math_prm_head_layout_without_remote_code(tmp_path):
    ref = spread(TinyPRM(transformers.Qwen2Config(**TINY)), seed=3)
    ref.save_pretrained(tmp_path)
    model = load_classifier(tmp_path)
    assert (model.head, model.num_labels) == ("mlp", 2)
    ids, mask = batch("right", seed=4)
    with torch.no_grad():
        want = ref(torch.tensor(ids), torch.tensor(mask)).numpy()
    real = mask.astype(bool)
    np.testing.assert_allclose(ours(model, ids, mask)[real], want[real], atol=ATOL, rtol=0)


def test_our_export_loads_in_transformers_with_the_same_scores(tmp_path):
    hf_classifier("qwen2", "sequence", 1, seed=5).save_pretrained(tmp_path / "hf")
    model = load_classifier(tmp_path / "hf")
    save_classifier(model, tmp_path / "ours", task="sequence")
    assert json.loads((tmp_path / "ours" / "config.json").read_text())["architectures"] == [
        "Qwen2ForSequenceClassification"]
    back = transformers.Qwen2ForSequenceClassification.from_pretrained(tmp_path / "ours").eval()
    ids, mask = batch("left")
    with torch.no_grad():
        want = back(input_ids=torch.tensor(ids), attention_mask=torch.tensor(mask)).logits.numpy()
    got = sequence_logits(jnp.asarray(ours(model, ids, mask)), jnp.asarray(ids), jnp.asarray(mask), pad_token_id=PAD)
    np.testing.assert_allclose(np.asarray(got), want, atol=ATOL, rtol=0)


def test_a_model_without_a_score_head_is_refused_in_one_line_naming_the_folder(tmp_path):
    cfg = transformers.Qwen2Config(**TINY)
    transformers.Qwen2ForCausalLM(cfg).save_pretrained(tmp_path)
    with pytest.raises(CheckpointError) as e:
        load_classifier(tmp_path)
    message = str(e.value)
    assert "\n" not in message and str(tmp_path) in message and "no score head" in message
    assert "Qwen2ForCausalLM" in message


def test_a_config_listing_other_labels_than_the_head_is_refused(tmp_path):
    hf_classifier("qwen2", "sequence", 1).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    config["id2label"] = {"0": "bad", "1": "good"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="2 labels .* 1 outputs"):
        load_classifier(tmp_path)
