"""The objectives added since mid-2025 in the real update (docs/objectives_recent.md#since-mid-2025): the step does
not depend on micro_batches (1 / 2 / 4) or packing, Clip-Cov and KL-Cov select over the whole update batch
(checked against a NumPy selection), and every objective gives the same terms on a 2-device mesh."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dapo_jax.models.logprobs import response_logprobs
from dapo_jax.objectives.diagnostics import finalize_metrics
from dapo_jax.objectives.loss import objective_terms
from dapo_jax.objectives.registry import load_objective
from dapo_jax.training.update.train_step import init_train_state
from tests.training.update.test_packed_step import G, P, T, _fields, _steps, make_batch, tiny_model

COV = {"clip_cov": dict(clip_cov_ratio=0.2, clip_cov_lb=0.0, clip_cov_ub=5.0), "kl_cov": dict(kl_cov_ratio=0.1)}
# (recipe, overrides, micro_batches to compare, the diagnostic that must be non-zero)
CASES = [
    ("clip_cov", COV["clip_cov"], (1, 2, 4), "cov_selected_frac"),
    ("kl_cov", COV["kl_cov"], (1, 2, 4), "cov_selected_frac"),
    ("dapo_icepop", {"off_policy_cap": 1.2, "off_policy_cap_low": 0.8, "off_policy_batch_normalize": True,
                     "dynamic_sampling": False, "overlong_buffer": None}, (1, 2, 4), "behaviour_masked_frac"),
    ("sapo", {}, (1, 4), "sapo_weight_mean"),
    ("gmpo", {"eps_low": 0.05, "eps_high": 0.05}, (1, 4), "gmpo_clip_frac"),
    ("dppo", {"dppo_delta_low": 0.001, "dppo_delta_high": 0.001}, (1, 4), "dppo_masked_frac"),
    ("dppo_kl", {"dppo_delta_low": 1e-4, "dppo_delta_high": 1e-4}, (1, 4), "dppo_masked_frac"),
    ("grpo_v32", {"opsm_delta": 0.0}, (1, 4), "opsm_masked_frac"),
    ("dapo_geo_mask", {"off_policy_cap": 1.05, "off_policy_cap_low": 0.95, "overlong_buffer": None}, (1, 4),
     "behaviour_masked_frac"),
]


_RUNS = {}


def _update(name, overrides, m, packed):
    """New params and metrics of one SGD step on `make_batch()` (cached: the tests share compiled steps)."""
    key = (name, tuple(sorted(overrides.items())), m, packed)
    if key not in _RUNS:
        objective = load_objective(name, **overrides)
        params, tx, unpacked_step, packed_step = _steps(objective, 1, m, G)
        step = packed_step if packed else unpacked_step
        state, metrics = step(init_train_state(params, tx), _fields(objective, make_batch()))
        _RUNS[key] = ([np.asarray(x) for x in jax.tree.leaves(state.params)],
                      {k: float(v) for k, v in metrics.items()})
    return _RUNS[key]


@pytest.mark.slow
@pytest.mark.parametrize("name,overrides,micros,diagnostic", CASES, ids=[c[0] for c in CASES])
def test_update_does_not_depend_on_micro_batches_or_packing(name, overrides, micros, diagnostic):
    """Batch-level statistics (the first three): micro_batches 1 / 2 / 4 and packed; the per-token and
    per-response objectives: 1 and 4 (a micro-batch holds whole responses, so nothing else can differ)."""
    want_params, want = _update(name, overrides, 1, False)
    assert want["update_applied"] == 1.0 and want["loss"] != 0.0
    assert want[diagnostic] > 0, diagnostic
    runs = [(m, False) for m in micros[1:]] + ([(2, True)] if len(micros) == 3 else [])
    for m, packed in runs:
        params, metrics = _update(name, overrides, m, packed)
        for a, b in zip(params, want_params):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7, err_msg=f"{name} m={m} packed={packed}")
        for k in want:
            np.testing.assert_allclose(metrics[k], want[k], rtol=2e-5, atol=1e-6, err_msg=f"{name} {k} m={m}")


def np_selection(name, logp, old, a, mask, u, o):
    """The tokens Clip-Cov / KL-Cov act on, chosen in float64 NumPy over the whole batch."""
    v = mask > 0
    cov = (a - a[v].mean()) * (logp - logp[v].mean())
    if name == "kl_cov":
        k = max(int(o["kl_cov_ratio"] * v.sum()), 1)
        return v & (cov >= np.sort(cov[v])[::-1][k - 1])
    r = np.exp(logp - old)
    # the clip_cov recipe opens the clip to [1 − 1, 1 + 1] (eps_low = eps_high = 1)
    cand = v & (cov > o["clip_cov_lb"]) & (cov < o["clip_cov_ub"]) & ~(-a * np.clip(r, 0.0, 2.0) > -a * r)
    n = min(max(int(o["clip_cov_ratio"] * v.sum()), 1), cand.sum())
    sel = np.zeros(mask.shape, bool)
    sel.flat[np.argsort(-np.where(cand, u, -np.inf), axis=None)[:n]] = True
    return sel


@pytest.mark.parametrize("name", ["clip_cov", "kl_cov"])
def test_covariance_selection_is_the_whole_batch_selection(name):
    """micro_batches = 4 gives the SGD step of the whole-batch loss with the selection made in NumPy."""
    batch = make_batch()
    graphdef, params = nnx.split(tiny_model())
    logp = np.asarray(response_logprobs(nnx.merge(graphdef, params), batch.prompt_ids, batch.prompt_mask,
                                        batch.response_ids, batch.response_mask, temperature=1.0)[0], np.float64)
    old, a, mask = (np.asarray(x, np.float64) for x in (batch.old_logp, batch.advantages, batch.response_mask))
    u = np.asarray(jax.random.uniform(jax.random.fold_in(jax.random.PRNGKey(0), 0), (P, G, T)))  # the step-0 draw
    sel = jnp.asarray(np_selection(name, logp, old, a, mask, u, COV[name]), jnp.float32)
    assert 0 < float(sel.sum()) < mask.sum()

    def loss(params):
        lp = response_logprobs(nnx.merge(graphdef, params), batch.prompt_ids, batch.prompt_mask, batch.response_ids,
                               batch.response_mask, temperature=1.0)[0]
        x = lp - batch.old_logp
        r, adv = jnp.exp(x), batch.advantages
        if name == "kl_cov":
            ell = -adv * r + sel * jnp.abs(x)
        else:
            ell = jnp.maximum(-adv * r, -adv * jnp.clip(r, 0.0, 2.0)) * (1 - sel)
        return jnp.sum(ell * batch.response_mask) / jnp.sum(batch.response_mask)

    grads = jax.grad(loss)(params)
    want = [np.asarray(p) - 0.1 * np.asarray(g) for p, g in zip(jax.tree.leaves(params), jax.tree.leaves(grads))]
    got, metrics = _update(name, COV[name], 4, False)
    for x, y in zip(got, want):
        np.testing.assert_allclose(x, y, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(metrics["cov_selected_frac"], float(sel.sum()) / mask.sum(), rtol=1e-6)


MESH_CASES = [("clip_cov", COV["clip_cov"]), ("kl_cov", COV["kl_cov"]), ("sapo", {}), ("gmpo", {}), ("dppo", {}),
              ("dppo_kl", {}), ("grpo_v32", {"opsm_delta": 0.01}), ("dapo_icepop", {"off_policy_batch_normalize": True}),
              ("dapo_k3_mask", {"off_policy_k3_threshold": 0.02})]


def test_terms_on_a_two_device_mesh_match_one_device():
    rng = np.random.default_rng(3)
    shape = (4, 4, 6)
    old = rng.normal(size=shape).astype(np.float32) - 2.0
    mask = (np.arange(6) < rng.integers(1, 7, (4, 4))[..., None]).astype(np.float32)
    kw = dict(logp=old + 0.3 * rng.normal(size=shape).astype(np.float32), old_logp=old, mask=mask,
              advantages=np.repeat(rng.normal(size=(4, 4, 1)), 6, 2).astype(np.float32),
              ref_logp=old + 0.2 * rng.normal(size=shape).astype(np.float32),
              behaviour_logp=old + 0.2 * rng.normal(size=shape).astype(np.float32))
    mesh = jax.make_mesh((2,), ("p",), axis_types=(jax.sharding.AxisType.Auto,))
    put = lambda x: jax.device_put(x, jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("p")))  # noqa: E731
    for name, overrides in MESH_CASES:
        cfg = load_objective(name, **overrides)
        args = {k: v for k, v in kw.items() if (k != "ref_logp" or cfg.needs_reference)
                and (k != "behaviour_logp" or cfg.needs_behaviour_logp)}
        terms = jax.jit(lambda lp, rest: objective_terms(cfg, logp=lp, **rest))
        grad = jax.jit(jax.grad(lambda lp, rest: objective_terms(cfg, logp=lp, **rest)[0]))
        rest = {k: v for k, v in args.items() if k != "logp"}
        s, d, m = terms(args["logp"], rest)
        g = grad(args["logp"], rest)
        srest = {k: put(v) for k, v in rest.items()}
        s2, d2, m2 = terms(put(args["logp"]), srest)
        g2 = grad(put(args["logp"]), srest)
        assert len(g2.sharding.device_set) == 2
        np.testing.assert_allclose(float(s2), float(s), rtol=1e-6, err_msg=name)
        assert float(d2) == float(d), name
        np.testing.assert_allclose(np.asarray(g2), np.asarray(g), rtol=1e-6, atol=1e-9, err_msg=name)
        f, f2 = finalize_metrics(m), finalize_metrics(m2)
        for k in f:
            np.testing.assert_allclose(float(f2[k]), float(f[k]), rtol=1e-6, atol=1e-9, err_msg=f"{name} {k}")
