"""On-policy distillation in a run (training/update/distill.py): a frozen teacher of another size scores the
student's samples; a teacher that is the student measures no KL; another tokenizer is refused in one line."""

import math

import pytest
from tests.training.conftest import make_tiny_model

from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import train
from dapo_jax.training.metrics import read_metrics


def distill_run(model_dir, run_dir, teacher, overrides_for, **extra):
    extra = {"train.steps": 1, "data.eval": "null", "distill.teacher": str(teacher), "distill.task_weight": 0,
             "objective.dynamic_sampling": "false", **extra}
    cfg = load_config(None, overrides_for(model_dir, run_dir, **extra))
    train(cfg)
    return [r for r in read_metrics(run_dir) if "grad_norm" in r]


def test_a_teacher_that_is_the_student_measures_no_kl(tiny_model_dir, tmp_path, overrides_for):
    rows = distill_run(tiny_model_dir, tmp_path / "run", tiny_model_dir, overrides_for)
    # log π_old − log π_T = 0 on every token: no distillation signal and (task_weight 0) no advantage at all
    assert abs(rows[0]["distill/reverse_kl"]) < 1e-6
    assert abs(rows[0]["advantage_sq_mean"]) < 1e-10


def test_a_teacher_of_another_size(tiny_model_dir, tmp_path, overrides_for):
    from flax import nnx

    from dapo_jax.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.models.hf_io import save_pretrained

    tok = build_char_tokenizer()
    cfg = ModelConfig(model_type="qwen2", vocab_size=100, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, tie_word_embeddings=False, attention_bias=True,
                      eos_token_id=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, max_position_embeddings=64)
    teacher = tmp_path / "teacher"
    save_pretrained(Decoder(cfg, rngs=nnx.Rngs(7)), teacher)
    save_char_tokenizer(teacher)
    rows = distill_run(tiny_model_dir, tmp_path / "run", teacher, overrides_for, **{"distill.task_weight": 1.0})
    kl = rows[0]["distill/reverse_kl"]
    assert math.isfinite(kl) and kl > 0.01  # two random models: the student's samples are far from the teacher's
    assert rows[0]["advantage_sq_mean"] > 0 and rows[0]["update_applied"] == 1.0


def test_another_tokenizer_is_refused_in_one_line(tiny_model_dir, tmp_path, overrides_for, capsys):
    from dapo_jax.cli import main
    from dapo_jax.data.char_tokenizer import save_char_tokenizer

    teacher = make_tiny_model(tmp_path / "teacher")
    save_char_tokenizer(teacher, alphabet="0123456789+-= ")  # another vocabulary
    run_dir = tmp_path / "run"
    code = main(["train", "tiny_dapo", *overrides_for(tiny_model_dir, run_dir, **{"distill.teacher": str(teacher)})])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "distill.teacher: its tokenizer" in err and len(err.splitlines()) == 1, err
    assert not (run_dir / "checkpoints").exists()


@pytest.mark.parametrize("objective", ["sft", "vapo"])
def test_distillation_needs_a_policy_gradient_objective(tiny_model_dir, tmp_path, overrides_for, objective):
    from dapo_jax.training.config.base import ConfigError

    with pytest.raises(ConfigError, match="distill: on-policy distillation adds to a policy-gradient"):
        load_config("dapo_jax/configs/cot_sft.yaml" if objective == "sft" else "tiny_vapo",
                    [f"distill.teacher={tiny_model_dir}"])
