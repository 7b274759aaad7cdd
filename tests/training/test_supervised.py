"""Supervised fine-tuning through the shared update (training/supervised.py): the update's loss equals a
NumPy reference of the masked NLL, only the assistant's tokens count, the update does not depend on how
the batch is split, and a run (`dapo-jax sft`) resumes exactly."""

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dapo_jax.data.supervised import SupervisedExample, SupervisedStream
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder
from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.config.paths import find_config
from dapo_jax.training.config.run import load_config
from dapo_jax.training.loop import load_trained_model, train
from dapo_jax.training.metrics import read_metrics
from dapo_jax.training.update.packed_step import PackedUpdate
from dapo_jax.training.build import load_tokenizer
from dapo_jax.training.supervised import supervised_groups, supervised_stream
from dapo_jax.training.update.train_step import Batch, init_train_state, make_train_step

V, S, T = 32, 6, 7
PAD = 0


def tiny_model(seed=0):
    cfg = ModelConfig(model_type="qwen2", vocab_size=V, hidden_size=16, intermediate_size=32,
                      num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    return Decoder(cfg, rngs=nnx.Rngs(seed))


def hand_examples(seed=0, n=4):
    """`n` examples of ragged prompt and response lengths (response lengths 1 .. T)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        prompt = tuple(int(x) for x in rng.integers(1, V, rng.integers(1, S + 1)))
        response = tuple(int(x) for x in rng.integers(1, V, [T, 1, 4, 2][i % 4]))
        out.append(SupervisedExample(prompt, f"p{i}", f"r{i}", i, response_ids=response))
    return out


def batch_of(examples):
    stream = SupervisedStream(examples, SimpleNamespace(pad_token_id=PAD, eos_token_id=1), max_prompt_length=S)
    g = supervised_groups(stream, examples, response_length=T)
    zeros = jnp.zeros(g.response_ids.shape, jnp.float32)
    return Batch(jnp.asarray(g.prompt_ids), jnp.asarray(g.prompt_mask), jnp.asarray(g.response_ids),
                 jnp.asarray(g.response_mask), zeros, zeros, zeros), g


def numpy_nll(model, examples):
    """-Σ log π(response tokens) / Σ |response| with each example as its own unpadded sequence, the
    log-softmax in NumPy (float64): nothing of the packing, the padding or `response_logprobs`."""
    total, count = 0.0, 0
    w = np.asarray(model.output_embedding(), np.float64)  # [d, V]
    for e in examples:
        seq = np.array(e.ids + e.response_ids)[None]
        hidden, _ = model(jnp.asarray(seq), jnp.arange(seq.shape[1])[None], jnp.ones_like(seq))
        logits = np.asarray(hidden[0], np.float64) @ w
        logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
            - logits.max(-1, keepdims=True)
        start = len(e.ids) - 1  # the last prompt token predicts the first response token
        total -= sum(logp[start + t, tok] for t, tok in enumerate(e.response_ids))
        count += len(e.response_ids)
    return total / count


def steps(n=1, m=1, lr=0.1):
    graphdef, params = nnx.split(tiny_model())
    tx, schedule = optax.sgd(lr), optax.constant_schedule(lr)  # new params = params - lr * grad
    kw = dict(objective=load_objective("sft"), num_minibatches=n, micro_batches=m)
    return params, tx, make_train_step(graphdef, tx, schedule, **kw), PackedUpdate(graphdef, tx, schedule, **kw)


def leaves(state):
    return [np.asarray(x) for x in jax.tree.leaves(state.params)]


def test_update_loss_equals_a_numpy_reference():
    examples = hand_examples()
    batch, groups = batch_of(examples)
    assert groups.response_ids.shape == (4, 1, T) and groups.prompt_ids.shape == (4, S)
    ref = numpy_nll(tiny_model(), examples)
    params, tx, unpacked, packed = steps()
    for step in (unpacked, packed):
        _, metrics = step(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
        np.testing.assert_allclose(float(metrics["loss"]), ref, rtol=1e-5)
        np.testing.assert_allclose(float(metrics["nll"]), ref, rtol=1e-5)
        assert float(metrics["update_tokens"]) == sum(len(e.response_ids) for e in examples)


def test_only_the_response_tokens_count():
    """Tokens outside the mask (the prompt's left padding, the responses' right padding) change neither the
    loss nor the update; a trained token does."""
    examples = hand_examples(1)
    batch, _ = batch_of(examples)
    rng = np.random.default_rng(5)
    noisy = batch._replace(
        prompt_ids=jnp.where(batch.prompt_mask > 0, batch.prompt_ids, rng.integers(1, V, batch.prompt_ids.shape)),
        response_ids=jnp.where(batch.response_mask > 0, batch.response_ids,
                               rng.integers(1, V, batch.response_ids.shape)))
    assert not np.array_equal(noisy.response_ids, batch.response_ids)
    params, tx, unpacked, packed = steps()
    for step in (unpacked, packed):
        a, ma = step(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
        b, mb = step(init_train_state(jax.tree.map(jnp.copy, params), tx), noisy)
        assert float(ma["loss"]) == pytest.approx(float(mb["loss"]), rel=1e-6)
        for x, y in zip(leaves(a), leaves(b)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)
    flipped = batch._replace(response_ids=batch.response_ids.at[0, 0, 0].set((batch.response_ids[0, 0, 0] + 1) % V))
    _, mf = unpacked(init_train_state(jax.tree.map(jnp.copy, params), tx), flipped)
    _, ma = unpacked(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
    assert float(mf["loss"]) != pytest.approx(float(ma["loss"]), rel=1e-6)


@pytest.mark.parametrize("m", [2, 4])
def test_micro_batching_and_packing_do_not_change_the_update(m):
    """One token mean over the batch: the same new parameters whole, in micro-batches, packed or not."""
    batch, _ = batch_of(hand_examples(2))
    params, tx, unpacked, packed = steps()
    whole, mw = unpacked(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
    _, _, unpacked_m, packed_m = steps(m=m)
    for step in (unpacked_m, packed_m):
        split, ms = step(init_train_state(jax.tree.map(jnp.copy, params), tx), batch)
        np.testing.assert_allclose(float(ms["loss"]), float(mw["loss"]), rtol=1e-5)
        for x, y in zip(leaves(split), leaves(whole)):
            np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-7)


# ----------------------------------------------------------------------------- the run, end to end
def sft_file(path: Path, n=24) -> Path:
    rows = [{"prompt": f"{i % 9}+{i % 7}=", "response": str(i % 9 + i % 7)} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def sft_overrides(model_dir, run_dir, data, **extra):
    base = {"model.path": str(model_dir), "data.train.name": str(data),
            "data.train.format": "sft", "data.train.options": "{}", "data.eval": "null",
            "data.max_prompt_length": 8, "rollout.train_batch": 4, "rollout.max_new_tokens": 4,
            "optim.lr": 1e-2, "optim.warmup_steps": 0, "optim.weight_decay": 0.0, "train.steps": 4,
            "train.checkpoint_every": 2, "train.progress": "false", "train.tensorboard": "false",
            "train.run_dir": str(run_dir), "reward.functions": "[{name: synthetic}]"}
    base.update(extra)
    return [f"{k}={v}" for k, v in base.items()]


def params_of(cfg, run_dir):
    model, _, step = load_trained_model(cfg, run_dir)
    return step, [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Param))]


def test_run_learns_and_resumes_exactly(tiny_model_dir, tmp_path):
    data = sft_file(tmp_path / "sft.jsonl")
    straight = load_config(find_config("cot_sft"), sft_overrides(tiny_model_dir, tmp_path / "straight", data))
    train(straight)
    rows = [r for r in read_metrics(tmp_path / "straight") if "loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    assert rows[-1]["loss"] < rows[0]["loss"]  # it fits the data
    assert all(r["update_tokens"] == r["sft/tokens"] > 0 for r in rows)  # every response token, nothing else

    # the run stopped after step 2's checkpoint, then the same command again: the same steps 3 and 4
    resumed_dir = tmp_path / "resumed"
    shutil.copytree(tmp_path / "straight", resumed_dir)
    shutil.rmtree(resumed_dir / "checkpoints" / "4")
    metrics = resumed_dir / "metrics.jsonl"
    metrics.write_text("".join(line + "\n" for line in metrics.read_text().splitlines()
                               if json.loads(line)["step"] <= 2))
    train(load_config(find_config("cot_sft"), sft_overrides(tiny_model_dir, resumed_dir, data)))
    (sa, pa), (sb, pb) = params_of(straight, tmp_path / "straight"), params_of(straight, resumed_dir)
    assert sa == sb == 4
    for a, b in zip(pa, pb):
        np.testing.assert_array_equal(a, b)
    again = [r for r in read_metrics(resumed_dir) if "loss" in r]
    assert [r["step"] for r in again] == [1, 2, 3, 4]
    assert [r["loss"] for r in again] == [r["loss"] for r in rows]
    assert [r["sft/epoch"] for r in again] == [r["sft/epoch"] for r in rows]  # the same examples, in order


def test_cli_refuses_what_the_user_must_fix_in_one_line(tiny_model_dir, tmp_path, capsys):
    from dapo_jax.cli import main

    def cli(*args):
        code = main(list(args))
        return code, capsys.readouterr().err.strip()

    data = sft_file(tmp_path / "sft.jsonl")
    code, err = cli("sft", "tiny_dapo", f"model.path={tiny_model_dir}", f"train.run_dir={tmp_path / 'r'}")
    assert code == 2 and "is not supervised fine-tuning" in err and len(err.splitlines()) == 1, err
    bad = tmp_path / "bad.jsonl"
    bad.write_text(data.read_text() + json.dumps({"prompt": "1+1="}) + "\n")
    code, err = cli("sft", "cot_sft", *sft_overrides(tiny_model_dir, tmp_path / "r2", bad))
    assert code == 2 and "row 24 has no response field 'response'" in err and len(err.splitlines()) == 1, err
    code, err = cli("sft", "cot_sft", *sft_overrides(tiny_model_dir, tmp_path / "r3", data,
                                                      **{"rollout.temperature": 0.7}))
    assert code == 2 and "rollout.temperature" in err, err
    assert not (tmp_path / "r2").exists() and not (tmp_path / "r3").exists()  # refused before anything is written


def test_lora_sft_trains_the_adapters_only(tiny_model_dir, tmp_path):
    from dapo_jax.models.hf_io import load_pretrained

    data = sft_file(tmp_path / "sft.jsonl")
    cfg = load_config(find_config("cot_sft"), sft_overrides(tiny_model_dir, tmp_path / "lora", data,
                                                            **{"lora": "{rank: 4}", "train.steps": 2}))
    train(cfg)
    rows = [r for r in read_metrics(tmp_path / "lora") if "loss" in r]
    assert [r["update_applied"] for r in rows] == [1.0, 1.0] and rows[1]["loss"] < rows[0]["loss"]
    model, _, step = load_trained_model(cfg, tmp_path / "lora")  # the adapters merged into the base
    def flat(m):
        return {"/".join(map(str, k)): np.asarray(v.get_value() if hasattr(v, "get_value") else v.value)
                for k, v in nnx.to_flat_state(nnx.state(m, nnx.Param))}

    base, tuned = flat(load_pretrained(tiny_model_dir)), flat(model)
    assert step == 2 and base.keys() == tuned.keys()
    assert any(not np.array_equal(base[k], tuned[k]) for k in base if "q_proj" in k)  # the adapters moved them
    embed = [k for k in base if "embed_tokens" in k]
    assert embed and all(np.array_equal(base[k], tuned[k]) for k in embed)  # no adapter there: untouched


def test_cli_sft_runs_cot_sft_by_default(monkeypatch, tmp_path):
    import dapo_jax.training.loop as loop
    from dapo_jax.cli import main

    seen = []
    monkeypatch.setattr(loop, "train", lambda cfg: seen.append(cfg) or {"step": 0})
    assert main(["sft", f"train.run_dir={tmp_path}"]) == 0
    assert seen[0].objective_config.supervised and seen[0].data.train.name == "cot"


def test_order_seed_orders_the_examples_and_leaves_the_problems_alone():
    """`data.order_seed` (the experiments' per-seed knob) permutes the SFT examples as it permutes RL's prompts:
    epoch 0 visits them in `default_rng([order_seed, 0]).permutation(n)`; the problems are data.seed's."""
    def first_epoch(*overrides):
        cfg = load_config(find_config("cot_sft"), ["data.train.limit=12", *overrides])
        stream = supervised_stream(cfg, load_tokenizer(cfg))
        return [e.text for e in stream.examples], [e.text for e in stream.next_examples(12)]

    examples, default = first_epoch()
    same, seeded = first_epoch("data.order_seed=3")
    assert same == examples and len(examples) == 12  # the same 12 problems
    assert default == [examples[i] for i in np.random.default_rng([0, 0]).permutation(12)]  # data.seed's order
    assert seeded == [examples[i] for i in np.random.default_rng([3, 0]).permutation(12)]
    assert seeded != default
