"""LoRA training (training/update/lora.py): only the adapters in the optimizer and the gradients, the base frozen
and the reference policy, the sampler's merged weights giving the trainer's log-probs, and a 2-step run of
dapo_jax/configs/tiny_dapo_lora.yaml that resumes and exports."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.decoder import Decoder
from dapo_jax.models.hf_io import load_pretrained
from dapo_jax.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, merged_decoder
from dapo_jax.objectives.config import ObjectiveConfig
from dapo_jax.sampling.config import SamplingConfig
from dapo_jax.sampling.sampler import make_generate
from dapo_jax.training.config.base import ConfigError
from dapo_jax.training.config.paths import CONFIG_DIR
from dapo_jax.training.config.run import load_config
from dapo_jax.training.config.sections import LoRASection, OptimSection
from dapo_jax.training.update.lora import PolicyWeights
from dapo_jax.training.update.train_step import (
    Batch, init_train_state, make_logprob_fn, make_optimizer, make_train_step, policy_logprobs,
)

P, G, S, T = 2, 2, 4, 3
LORA = LoRASection(rank=2, alpha=4.0, targets=["q_proj", "v_proj", "o_proj", "down_proj"])


@pytest.fixture(scope="module")
def base_dir(tiny_model_dir):
    return tiny_model_dir  # tests/training/conftest.py: 1 layer, d=16, vocab 100


def batch_arrays(seed: int = 0):
    rng = np.random.default_rng(seed)
    prompt_ids = jnp.asarray(rng.integers(3, 90, (P, S)), jnp.int32)
    prompt_mask = jnp.asarray([[0, 1, 1, 1], [1, 1, 1, 1]], jnp.int32)
    response_ids = jnp.asarray(rng.integers(3, 90, (P, G, T)), jnp.int32)
    response_mask = jnp.asarray(np.array([[[1, 1, 1], [1, 1, 0]], [[1, 0, 0], [1, 1, 1]]]), jnp.float32)
    return prompt_ids, prompt_mask, response_ids, response_mask


def trained_adapters(params, seed: int = 1):
    """Nonzero adapters (as after some training): B = 0 would hide every difference."""
    leaves, tree = jax.tree.flatten(params)
    keys = jax.random.split(jax.random.PRNGKey(seed), len(leaves))
    return jax.tree.unflatten(tree, [0.3 * jax.random.normal(k, x.shape) for k, x in zip(keys, leaves)])


def nbytes(tree) -> int:
    return sum(x.nbytes for x in jax.tree.leaves(tree))


def test_only_adapters_are_trained_and_the_optimizer_holds_only_their_moments(base_dir):
    full_policy, full = PolicyWeights.build(load_pretrained(base_dir), None)
    assert not full_policy.is_lora and full_policy.trainer(full) is full and full_policy.step_kwargs == {}
    policy, adapters = PolicyWeights.build(load_pretrained(base_dir), LORA)
    paths = [p for p, _ in nnx.to_flat_state(adapters)]
    assert len(paths) == 4 * 2 and all(p[-2] == "lora" for p in paths)  # 4 targets x (A, B), 1 layer
    assert all(isinstance(v, nnx.LoRAParam) for _, v in nnx.to_flat_state(adapters))
    assert nbytes(policy.frozen) == nbytes(full)  # the base, once
    tx, _ = make_optimizer(OptimSection(lr=1e-2, weight_decay=0.1))
    opt = init_train_state(adapters, tx).opt_state
    float_leaves = [x for x in jax.tree.leaves(opt) if jnp.issubdtype(x.dtype, jnp.floating)]
    assert sum(x.nbytes for x in float_leaves) == 2 * nbytes(adapters)  # Adam's mu and nu of the adapters only
    assert nbytes(adapters) < nbytes(full) / 5


def test_adapter_gradients_are_the_chain_rule_of_the_full_weights(base_dir):
    """d/dA and d/dB of the trainer's log-probs through (frozen base, adapters) against the gradient of
    the plain model's merged weights W' = W + s A B: dA = s dW' B^T, dB = s A^T dW'."""
    policy, adapters = PolicyWeights.build(load_pretrained(base_dir), LORA)
    adapters = trained_adapters(adapters)
    pid, pmask, rid, rmask = batch_arrays()

    def total(graphdef, weights):
        logp, _ = policy_logprobs(graphdef, weights, pid, pmask, rid, rmask, temperature=1.0)
        return jnp.sum(logp * rmask)

    g_ad = jax.jit(jax.grad(lambda ad: total(policy.graphdef, policy.trainer(ad))))(adapters)
    g_w = jax.jit(jax.grad(lambda w: total(policy.sampler_graphdef, w)))(policy.sampler(adapters))
    s = LORA.alpha / LORA.rank
    for name in ("q_proj", "v_proj"):
        a = np.asarray(adapters["layers"][0]["self_attn"][name]["lora"]["lora_a"][...])
        b = np.asarray(adapters["layers"][0]["self_attn"][name]["lora"]["lora_b"][...])
        dw = np.asarray(g_w["layers"][0]["self_attn"][name]["kernel"][...])
        got = g_ad["layers"][0]["self_attn"][name]["lora"]
        assert np.abs(dw).max() > 1e-3
        np.testing.assert_allclose(np.asarray(got["lora_a"][...]), s * dw @ b.T, rtol=2e-4, atol=1e-5)
        np.testing.assert_allclose(np.asarray(got["lora_b"][...]), s * a.T @ dw, rtol=2e-4, atol=1e-5)


def test_train_step_moves_the_adapters_and_leaves_the_base(base_dir):
    policy, adapters = PolicyWeights.build(load_pretrained(base_dir), LORA)
    adapters = trained_adapters(adapters)
    base_before = jax.tree.map(np.asarray, policy.frozen)
    adapters_before = jax.tree.map(np.asarray, adapters)
    objective = ObjectiveConfig(eps_low=0.2, eps_high=0.28)
    tx, schedule = make_optimizer(OptimSection(lr=1e-2, grad_clip=None))
    step = make_train_step(policy.graphdef, tx, schedule, objective=objective)
    pid, pmask, rid, rmask = batch_arrays()
    logp, _ = make_logprob_fn(policy.graphdef, temperature=1.0)(policy.trainer(adapters), pid, pmask, rid, rmask)
    adv = jnp.asarray([[1.0, -1.0], [-0.5, 0.5]])[..., None] * rmask
    batch = Batch(pid, pmask, rid, rmask, logp, adv, jnp.zeros_like(logp))
    state, metrics = step(init_train_state(adapters, tx), batch, **policy.step_kwargs)
    assert float(metrics["update_applied"]) == 1.0 and float(metrics["grad_norm"]) > 0
    jax.tree.map(np.testing.assert_array_equal, jax.tree.map(np.asarray, policy.frozen), base_before)
    moved = [np.abs(np.asarray(a) - b).max() for a, b in zip(jax.tree.leaves(state.params),
                                                               jax.tree.leaves(adapters_before))]
    assert min(moved) > 0  # every A and B took a step


def test_reference_is_the_base_and_the_sampler_gives_the_trainers_logprobs(base_dir):
    model = load_pretrained(base_dir)
    plain_graphdef, plain_state = nnx.split(load_pretrained(base_dir))
    policy, adapters = PolicyWeights.build(model, LORA)
    adapters = trained_adapters(adapters)
    pid, pmask, _, _ = batch_arrays()
    config = SamplingConfig(max_new_tokens=T, temperature=1.0, eos_token_ids=(1,), pad_token_id=0)
    out = make_generate(policy.sampler_graphdef, config, G)(policy.sampler(adapters), pid, pmask,
                                                            jax.random.PRNGKey(0))
    rmask = out.response_mask.astype(jnp.float32)
    assert float(rmask.sum()) >= P * G
    logprob_fn = make_logprob_fn(policy.graphdef, temperature=1.0)
    trainer, _ = logprob_fn(policy.trainer(adapters), pid, pmask, out.response_ids, rmask)
    np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(trainer * rmask), atol=2e-5)

    reference, _ = logprob_fn(policy.reference(adapters), pid, pmask, out.response_ids, rmask)
    base, _ = make_logprob_fn(plain_graphdef, temperature=1.0)(plain_state, pid, pmask, out.response_ids, rmask)
    np.testing.assert_allclose(np.asarray(reference), np.asarray(base), atol=1e-6)
    assert np.abs(np.asarray((trainer - base) * rmask)).max() > 1e-2  # the adapters do matter
    # no second copy of the base: the reference's weights are the frozen arrays themselves
    ref_base, zeros = policy.reference(adapters)
    assert ref_base is policy.frozen and not any(np.any(np.asarray(x)) for x in jax.tree.leaves(zeros))
    assert isinstance(policy.decoder(adapters), Decoder)


@pytest.mark.parametrize("override,key", [("lora.rank=0", "lora.rank"), ("lora.alpha=-1", "lora.alpha"),
                                          ("lora.targets=[q_proj,q_proj]", "lora.targets"),
                                          ("lora.targets=[lm_head]", "lora.targets.0"), ("lora.targets=[]", "lora.targets"),
                                          ("lora.dropout=0.1", "lora.dropout")])
def test_bad_lora_config_names_the_key(override, key):
    with pytest.raises(ConfigError, match=rf"tiny_dapo_lora.yaml: {key}: "):
        load_config(CONFIG_DIR / "tiny_dapo_lora.yaml", [override])
    assert load_config(CONFIG_DIR / "tiny_dapo_lora.yaml", ["lora=null"]).lora is None
    assert load_config(None, ["lora.rank=4"]).lora == LoRASection(rank=4)


@pytest.mark.slow
def test_recipe_trains_resumes_and_exports(tmp_path):
    from dapo_jax.cli import main
    from dapo_jax.training.state.checkpoint import Checkpointer
    from dapo_jax.training.loop import load_trained_model, train
    from dapo_jax.training.metrics import read_metrics

    run_dir = tmp_path / "run"
    small = [f"train.run_dir={run_dir}", "rollout.G=4", "rollout.train_batch=4", "rollout.gen_batch=8",
             "rollout.max_gen_batches=2", "data.eval=null", "optim.num_minibatches=1",
             "train.checkpoint_every=1", "train.eval_every=0", "train.progress=false", "train.tensorboard=false"]
    cfg = load_config(CONFIG_DIR / "tiny_dapo_lora.yaml", small + ["train.steps=1"])
    assert cfg.lora is not None and cfg.lora.rank == 8
    train(cfg)
    # the checkpoint holds the adapters and their optimizer state, nothing of the base's size
    import orbax.checkpoint as ocp

    ckpt = Checkpointer(run_dir / "checkpoints")
    meta = ckpt.manager.restore(1, args=ocp.args.Composite(meta=ocp.args.JsonRestore()))["meta"]
    ckpt.close()
    leaves = meta["checksums"]["state"]  # tree path -> shape and dtype of every saved leaf
    arrays = [k for k, v in leaves.items() if np.prod(v["shape"]) > 1]
    assert len(arrays) == 3 * 7 * 2 * 2, arrays  # (params, mu, nu) x 7 targets x (A, B) x 2 layers
    assert all("lora" in k for k in arrays)
    resumed = train(load_config(CONFIG_DIR / "tiny_dapo_lora.yaml", small + ["train.steps=2"]))
    assert resumed["step"] == 2 and Checkpointer(run_dir / "checkpoints").all_steps() == [1, 2]
    assert [r["step"] for r in read_metrics(run_dir)] == [1, 2]

    merged, _, step = load_trained_model(load_config(run_dir), run_dir)
    assert step == 2 and isinstance(merged, Decoder)
    assert main(["export", str(run_dir), str(tmp_path / "hf")]) == 0
    assert main(["export", str(run_dir), str(tmp_path / "peft"), "--peft"]) == 0
    assert (tmp_path / "peft" / ADAPTER_WEIGHTS).exists()
    assert json.loads((tmp_path / "peft" / ADAPTER_CONFIG).read_text())["r"] == 8
    exported = load_pretrained(tmp_path / "hf")
    for (p, a), (_, b) in zip(nnx.to_flat_state(nnx.state(exported, nnx.Param)),
                              nnx.to_flat_state(nnx.state(merged, nnx.Param))):
        np.testing.assert_array_equal(np.asarray(a.get_value()), np.asarray(b.get_value()), err_msg=str(p))
    adapted, _, _ = load_trained_model(load_config(run_dir), run_dir, adapters=True)
    base = load_pretrained(CONFIG_DIR.parent / "assets" / "tiny_base")
    assert merged_decoder(adapted) is not adapted
    diff = [np.abs(np.asarray(a.get_value()) - np.asarray(b.get_value())).max()
            for (_, a), (_, b) in zip(nnx.to_flat_state(nnx.state(merged, nnx.Param)),
                                      nnx.to_flat_state(nnx.state(base, nnx.Param)))]
    assert max(diff) > 0  # two steps of training moved the merged weights off the base
