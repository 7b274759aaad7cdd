"""A full DAPO step, side by side: dapo_jax vs TRL's GRPOTrainer vs Tunix's DAPOLearner, same workload.

    python -m benchmarks.peers                                      # 0.6M, 5M, 15M; peers if installed
    python -m benchmarks.peers --trl-python /work/venvs/bench-trl/bin/python \\
        --tunix-python /work/venvs/bench-tunix/bin/python
    python -m benchmarks.peers --quick --no-peers                   # smallest size, few steps (the test)

The peers come from the optional extra `pip install -e .[bench]` (TRL; Tunix may want other
transformers/tokenizers versions than the main install: give it its own venv and `--tunix-python`).
Each peer runs in a subprocess (`benchmarks.peers_trl`, `benchmarks.peers_tunix`) under the given
interpreter and prints the harness's result line; a peer that is not installed or fails is reported as
such, with the reason, and the others still run.

Same for everyone (`benchmarks/workload.py`): the weights (a random Qwen2-shaped model built here and
saved in Hugging Face safetensors; TRL loads it with transformers, Tunix with its Qwen2 safetensors
loader), the character tokenizer, the prompts, G, max prompt / response lengths, temperature 1, the
reward, the objective (DAPO: token-mean, clip-higher 0.2 / 0.28, no KL, group-normalised advantages,
1 update per rollout; dynamic sampling and overlong shaping OFF for comparability), AdamW (lr,
no weight decay, grad-norm clip 1.0), no eval, no checkpoints, no logging.

Ragged lengths with no framework hook: the embeddings carry a constant c in residual dimension
`LENGTH_DIM`, no layer writes into it, and the lm_head reads it only for EOS (and, negatively, pad
and unk), so every token has about the same EOS probability: lengths are geometric, with the mean
set by the EOS weight (calibrated here on the model's own hidden states). Each runner reports the
mean length it actually produced.

Figures per size: median step time over `timed_steps` after `warmup_steps`, its breakdown
(generate / update / host = the rest: decoding, reward, advantages, transfers), the ratio of each
peer's step time to ours, the update's FLOP/s against a matmul peak measured in this process (the mean
of the peaks measured just before and just after that run, printed in the `peak` column),
compilations after step 1, and the first step's time (`1st_step`: ours includes XLA's compilation of
every program; the peers have their own warm-up). Update FLOPs = 6 * N_matmul * T_real + 6 * L * H * D * sum(len^2)
(N_matmul: every weight matrix incl. lm_head, not the embedding lookup; T_real: real prompt +
response tokens; the second term the causal attention's QK^T and AV, forward + backward). These are
the workload's FLOPs, the same for every framework: our packed update lays out a group's prompt once
per row (shared prompts) and so computes fewer; the share of the sequences' tokens it lays out is
printed below the table.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from benchmarks.harness import median, run_child
from benchmarks.workload import LENGTH_DIM, QUICK, SIZES, Workload, emit, prompt_texts, reward, summarize

PEERS = {"trl": "benchmarks.peers_trl", "tunix": "benchmarks.peers_tunix"}


# ----------------------------------------------------------------------------- the shared model
def expected_length(p: float, t: int) -> float:
    """Mean of min(Geometric(p), t) (EOS included): (1 - (1-p)^t) / p."""
    return (1.0 - (1.0 - p) ** t) / p


def build_model(size: str, w: Workload, out_dir: Path) -> dict:
    """A random Qwen2-shaped model with the length control, saved as HF safetensors + tokenizer."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dapo_jax.data.char_tokenizer import build_char_tokenizer, save_char_tokenizer
    from dapo_jax.models.config import ModelConfig
    from dapo_jax.models.decoder import Decoder
    from dapo_jax.models.hf_io import save_pretrained

    tok = build_char_tokenizer()
    hf = dict(model_type="qwen2", vocab_size=len(tok), **SIZES[size], tie_word_embeddings=False,
              max_position_embeddings=256, rms_norm_eps=1e-6, rope_theta=10000.0, hidden_act="silu",
              eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None)
    cfg = ModelConfig.from_hf_dict(hf)
    model = Decoder(cfg, rngs=nnx.Rngs(w.seed))
    k, eos, banned = LENGTH_DIM, tok.eos_token_id, (tok.pad_token_id, tok.unk_token_id)
    emb = model.embed_tokens.embedding
    emb[...] = emb[...].at[:, k].set(0.05)  # the constant signal
    for layer in model.layers:  # nothing writes into dimension k
        for lin in (layer.self_attn.o_proj, layer.mlp.down_proj):
            lin.kernel[...] = lin.kernel[...].at[:, k].set(0.0)
    head = model.lm_head.kernel
    head[...] = head[...].at[k, :].set(0.0).at[:, eos].set(0.0)

    # calibrate: p_eos(beta) = sigmoid(beta * h_k - logsumexp(other logits)) on the model's hidden states
    rng = np.random.default_rng(w.seed)
    n = w.max_prompt_length + w.max_new_tokens
    ids = jnp.asarray(rng.integers(3, cfg.vocab_size, size=(32, n)), jnp.int32)
    hidden, _ = model(ids, jnp.broadcast_to(jnp.arange(n), ids.shape), jnp.ones_like(ids))
    logits = np.asarray(model.logits(hidden), np.float64)
    h_k = np.asarray(hidden[..., k], np.float64).ravel()
    others = np.delete(logits, [eos, *banned], axis=-1)
    lse = np.log(np.exp(others - others.max(-1, keepdims=True)).sum(-1)).ravel() + others.max(-1).ravel()
    lo, hi = 1e-4, 0.9  # p_target: expected_length(p) = mean_length
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_length(mid, w.max_new_tokens) > w.mean_length else (lo, mid)
    p_target = (lo + hi) / 2
    b_lo, b_hi = -1e3, 1e3
    for _ in range(100):
        beta = (b_lo + b_hi) / 2
        p = np.mean(1 / (1 + np.exp(-(beta * h_k - lse))))
        b_lo, b_hi = (beta, b_hi) if p < p_target else (b_lo, beta)
    head[...] = head[...].at[k, eos].set(beta)
    for b in banned:  # pad / unk: never sampled (a pad inside a response would confuse some maskers)
        head[...] = head[...].at[k, b].set(-60.0 / max(float(h_k.min()), 1e-3))
    save_pretrained(model, out_dir, tokenizer=None)
    save_char_tokenizer(out_dir)
    graph_params = nnx.state(model, nnx.Param)
    n_params = int(sum(x.size for x in jax.tree.leaves(graph_params)))
    n_embed = int(cfg.vocab_size * cfg.hidden_size)
    return {"size": size, "params": n_params, "matmul_params": n_params - n_embed, "eos_weight": float(beta),
            "p_eos_target": float(p_target), "layers": cfg.num_hidden_layers,
            "attn_dim": cfg.num_attention_heads * cfg.head_dim, "config": SIZES[size]}


def update_flops(info: dict, seq_lengths: list[int], tokens: int | None = None) -> float:
    """Model FLOPs of one update (forward + backward) over sequences of the given real lengths; the
    matmuls over `tokens` positions when given (e.g. those a packed update lays out), else every token."""
    tokens = sum(seq_lengths) if tokens is None else tokens
    attn = 6.0 * info["layers"] * info["attn_dim"] * sum(x * x for x in seq_lengths)
    return 6.0 * info["matmul_params"] * tokens + attn


def flops_rate(info: dict, seqs_per_step: list[list[int]], update_s: list[float]) -> float:
    """Median over the timed steps of update FLOPs / update seconds."""
    return median(update_flops(info, seqs) / u for seqs, u in zip(seqs_per_step, update_s))


def matmul_peak(n: int = 1024, repeats: int = 5, dtype: str = "float32") -> float:
    """Best FLOP/s of an n x n x n jnp.dot in this process (f32 unless `dtype` says otherwise)."""
    import jax
    import jax.numpy as jnp

    a = jax.random.normal(jax.random.PRNGKey(0), (n, n), jnp.dtype(dtype))
    f = jax.jit(lambda x, y: x @ y)
    f(a, a).block_until_ready()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        f(a, a).block_until_ready()
        best = min(best, time.perf_counter() - t0)
    return 2.0 * n ** 3 / best


# ----------------------------------------------------------------------------- our side
def has_packing() -> bool:
    from dapo_jax.training.config.sections import OptimSection

    try:
        from dapo_jax.training.update.packed_step import PackedUpdate  # noqa: F401
    except ImportError:
        return False
    return "packing" in OptimSection.model_fields


def has_compaction() -> bool:
    from dapo_jax.sampling.config import SamplingConfig

    return "compaction" in {f.name for f in dataclasses.fields(SamplingConfig)}


def default_fast_paths(w: Workload) -> tuple[bool, bool]:
    """`(optim.packing, rollout.compaction)` as a run config that leaves them unset resolves them for this
    workload (training/config/resolve.py): what a user's own config gets."""
    from dapo_jax.training.config.resolve import resolve
    from dapo_jax.training.config.run import RunConfig

    cfg = resolve(RunConfig.model_validate({
        "objective": {"name": "dapo", "dynamic_sampling": False, "overlong_buffer": None},
        "rollout": {"G": w.G, "train_batch": w.prompts, "gen_batch": w.prompts, "max_new_tokens": w.max_new_tokens},
        "data": {"max_prompt_length": w.max_prompt_length}}))
    return bool(cfg.optim.packing), bool(cfg.rollout.compaction)


def run_ours(model_dir: Path, w: Workload, info: dict, *, packing: bool, compaction: bool) -> dict:
    """The trainer's own functions (make_generate, make_train_step or PackedUpdate,
    compute_advantages), as the loop calls them, on a one-device mesh as the loop builds it."""
    import jax

    from dapo_jax.parallel.mesh import make_mesh
    from dapo_jax.training.metrics import compile_count

    compile_count()
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])  # as the trainer builds it for one device
    with jax.set_mesh(mesh):
        return _run_ours(model_dir, w, info, mesh, packing=packing, compaction=compaction)


def _run_ours(model_dir, w, info, mesh, *, packing: bool, compaction: bool) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from dapo_jax.models.hf_io import load_pretrained, load_tokenizer
    from dapo_jax.objectives.loss import compute_advantages
    from dapo_jax.objectives.registry import load_objective
    from dapo_jax.parallel.host import to_global
    from dapo_jax.parallel.mesh import batch_sharding
    from dapo_jax.sampling.config import SamplingConfig
    from dapo_jax.sampling.sampler import make_generate
    from dapo_jax.training.config.sections import OptimSection
    from dapo_jax.training.metrics import compile_count
    from dapo_jax.training.update.programs import make_update
    from dapo_jax.training.update.train_step import Batch, init_train_state, make_optimizer

    tok = load_tokenizer(model_dir)
    model = load_pretrained(model_dir, mesh=mesh)
    graphdef, params = nnx.split(model)
    put = lambda x: to_global(x, batch_sharding(mesh))  # noqa: E731
    objective = load_objective("dapo", dynamic_sampling=False, overlong_buffer=None,
                               max_response_length=w.max_new_tokens, eps_low=w.eps_low, eps_high=w.eps_high)
    optim = OptimSection(lr=w.lr, weight_decay=0.0, grad_clip=1.0, packing=packing)
    tx, schedule = make_optimizer(optim)
    state = init_train_state(params, tx)
    extra = {"compaction": True} if compaction else {}
    scfg = SamplingConfig(max_new_tokens=w.max_new_tokens, temperature=w.temperature,
                          eos_token_ids=(tok.eos_token_id,), pad_token_id=tok.pad_token_id, **extra)
    generate = make_generate(graphdef, scfg, w.G)
    # the update as the loop builds it (training/update/programs.py): packed or not, a group's prompt shared only where
    # the model's attention can branch
    train_step, _ = make_update(graphdef, tx, schedule, objective=objective, optim=optim,
                                temperature=scfg.logprob_temperature, mesh=mesh, attention=model.config.attention,
                                seq_len=w.max_prompt_length + w.max_new_tokens)

    @jax.jit
    def prepare(rewards, response_mask):
        adv = compute_advantages(objective, rewards, response_mask)
        return jnp.broadcast_to(adv[..., None], response_mask.shape) * response_mask

    texts = prompt_texts(w)
    key = jax.random.PRNGKey(w.seed)
    step_s, gen_s, upd_s, lengths, seqs, laid_out = [], [], [], [], [], []
    compiles_after_1 = None
    for step in range(w.steps):
        rows = [tok.encode(t, add_special_tokens=False) for t in texts[step * w.prompts:(step + 1) * w.prompts]]
        ids = np.full((w.prompts, w.max_prompt_length), tok.pad_token_id, np.int32)
        pmask = np.zeros_like(ids)
        for i, r in enumerate(rows):
            ids[i, w.max_prompt_length - len(r):], pmask[i, w.max_prompt_length - len(r):] = r, 1
        t0 = time.perf_counter()
        out = jax.block_until_ready(generate(state.params, *put((ids, pmask)), jax.random.fold_in(key, step)))
        t1 = time.perf_counter()
        resp, rmask = np.asarray(out.response_ids), np.asarray(out.response_mask)
        p, g, t = resp.shape
        decoded = tok.batch_decode(resp.reshape(p * g, t) * rmask.reshape(p * g, t), skip_special_tokens=True)
        rewards = np.asarray([reward(s) for s in decoded], np.float32).reshape(p, g)
        mask = rmask.astype(np.float32)
        t2 = time.perf_counter()
        rewards, mask = put((rewards, mask))
        adv = prepare(rewards, mask)
        batch = Batch(out.prompt_ids, out.prompt_mask, out.response_ids, mask, out.logprobs, adv,
                      jnp.zeros_like(out.logprobs))
        state, metrics = train_step(state, batch)
        jax.block_until_ready(metrics)
        t3 = time.perf_counter()
        step_s.append(t3 - t0)
        gen_s.append(t1 - t0)
        upd_s.append(t3 - t2)
        lens = rmask.sum(-1).ravel().tolist()
        lengths.append(lens)
        seqs.append([int(pmask[i // g].sum()) + int(x) for i, x in enumerate(lens)])
        if packing:  # tokens the packed rows hold (fewer than the sequences' with shared prompts); untimed
            laid_out.append(train_step.packing_stats(batch)["packed_tokens"])
        if step == 0:
            compiles_after_1 = compile_count()
    res = summarize(step_s, gen_s, upd_s, lengths, warmup=w.warmup_steps)
    res["update_flops_per_s"] = flops_rate(info, seqs[w.warmup_steps:], upd_s[w.warmup_steps:])
    res["compilations_after_step1"] = compile_count() - compiles_after_1
    if laid_out:  # the update's own work: the FLOP/s above count every sequence's prompt, as for the peers
        res["packed_token_fraction"] = float(np.sum(laid_out[w.warmup_steps:]) / np.sum(
            [sum(x) for x in seqs[w.warmup_steps:]]))
    res["framework"] = "dapo_jax" + (" +packing" if packing else "") + (" +compaction" if compaction else "")
    return res


# ----------------------------------------------------------------------------- peers
def run_peer(name: str, python: str, model_dir: Path, w: Workload, size: str, timeout: float) -> dict:
    """One peer in a subprocess: its result line's figures, or {"error": why}."""
    if not python:
        return {"framework": name, "error": f"skipped: no interpreter for {name} (--{name}-python)"}
    args = ["--model-dir", str(model_dir), "--workload", w.to_json(), "--size", size]
    result = run_child(PEERS[name], args, python=python, timeout=timeout)
    return {"framework": name, **result} if "error" in result else result


def default_python(name: str) -> str:
    """This interpreter when it can import the peer (`pip install -e .[bench]`), else ''."""
    module = {"trl": "trl", "tunix": "tunix"}[name]
    import importlib.util

    return sys.executable if importlib.util.find_spec(module) is not None else ""


def _set_peak(result: dict, before: float) -> float:
    """Measures the matmul peak after a run, sets the run's `peak_flops_per_s` to the mean of the peaks
    before and after it (both kept), and returns the new measurement (the next run's `before`)."""
    after = matmul_peak()
    result.update(peak_before=before, peak_after=after, peak_flops_per_s=(before + after) / 2)
    return after


# ----------------------------------------------------------------------------- report
def add_ratios(results: list[dict]) -> float | None:
    """Each peer's `ratio_to_ours` = its median step time / the fastest dapo_jax variant's (named in
    `ours_reference`); returns that step time (None when no dapo_jax run)."""
    ours = [r for r in results if r["framework"].startswith("dapo_jax") and "error" not in r]
    if not ours:
        return None
    ref = min(ours, key=lambda r: r["step_s"])
    for r in results:
        if "error" not in r and r not in ours:
            r["ratio_to_ours"] = r["step_s"] / ref["step_s"]
            r["ours_reference"] = ref["framework"]
    return ref["step_s"]


def fmt_row(r: dict, ours_step: float | None) -> str:
    if "error" in r:
        return f"  {r['framework']:<30} NOT RUN: {r['error']}"
    ratio = f"{r['step_s'] / ours_step:6.2f}x" if ours_step and "dapo_jax" not in r["framework"] else "     -"
    flops = f"{r['update_flops_per_s'] / 1e9:7.2f}" if r.get("update_flops_per_s") else "      -"
    frac = f"{100 * r['update_peak_fraction']:5.1f}%" if r.get("update_peak_fraction") is not None else "    -"
    comp = r.get("compilations_after_step1")
    return (f"  {r['framework']:<30} {r['step_s']:8.3f} {ratio} {r['generate_s']:8.3f} {r['update_s']:8.3f} "
            f"{r['host_s']:8.3f} {r['mean_length']:7.2f} {flops} {frac} {'n/a' if comp is None else comp:>6} "
            f"{r['peak_flops_per_s'] / 1e9:6.1f} {r['step_s_all'][0]:8.2f}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default=",".join(SIZES), help="comma-separated: " + ", ".join(SIZES))
    ap.add_argument("--quick", action="store_true", help="smallest size, a small workload, few steps")
    ap.add_argument("--no-peers", action="store_true", help="only dapo_jax")
    ap.add_argument("--trl-python", default=None, help="interpreter with trl installed (default: this one if it has trl)")
    ap.add_argument("--tunix-python", default=None, help="interpreter with google-tunix installed")
    ap.add_argument("--peer-timeout", type=float, default=1800.0, help="seconds per peer run")
    ap.add_argument("--variants", default=None,
                    help="dapo_jax variants: base, compaction, packing, packing+compaction, default (what a config "
                         "that sets neither gets) (default: every one this checkout has but default; --quick: the "
                         "last of them)")
    ap.add_argument("--prompts", type=int, default=None, help="prompts per step (default: the workload's)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default: the workload's)")
    ap.add_argument("--json", default=None, help="also write every result here (JSON lines)")
    args = ap.parse_args(argv)
    w = QUICK if args.quick else Workload()
    if args.steps:
        w = dataclasses.replace(w, timed_steps=args.steps)
    if args.prompts:
        w = dataclasses.replace(w, prompts=args.prompts)
    sizes = ["0.6m"] if args.quick else [s.strip() for s in args.sizes.split(",")]
    peers = {} if args.no_peers else {
        "trl": args.trl_python if args.trl_python is not None else default_python("trl"),
        "tunix": args.tunix_python if args.tunix_python is not None else default_python("tunix"),
    }
    import jax

    load = os.getloadavg()
    peak = matmul_peak()
    print(f"[benchmarks.peers] {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, {os.cpu_count()} CPUs, "
          f"load {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}, jax {jax.__version__} on {jax.devices()[0].platform}, "
          f"matmul peak {peak / 1e9:.1f} GFLOP/s (f32 1024^3 jnp.dot, best of 5)", flush=True)
    print(f"[benchmarks.peers] workload: {w.to_json()}", flush=True)
    available = {"base": (False, False)}
    if has_compaction():
        available["compaction"] = (False, True)
    if has_packing():
        available["packing"] = (True, False)
        if has_compaction():
            available["packing+compaction"] = (True, True)
    names = list(available)[-1:] if args.quick and not args.variants else (args.variants or ",".join(available)).split(",")
    if "packing+compaction" in available:
        available["default"] = default_fast_paths(w)  # a config that sets neither
    missing = [n for n in names if n not in available]
    if missing:
        print(f"[benchmarks.peers] dapo_jax variant(s) {missing} not available in this checkout (have {list(available)})")
    variants = [(n, available[n]) for n in names if n in available]
    all_results = []
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix=f"bench_peers_{size}_") as tmp:
            model_dir = Path(tmp)
            info = build_model(size, w, model_dir)
            load_before = list(os.getloadavg())
            print(f"\n== {size}: {info['params']:,} parameters ({info['config']}), EOS weight "
                  f"{info['eos_weight']:.3f} for p_eos {info['p_eos_target']:.4f}", flush=True)
            results, before = [], matmul_peak()
            # each run's %peak is against the mean of the peaks measured just before and just after it:
            # this machine's speed drifts within minutes, and one peak taken at the start misstates later runs
            for name, (packing, compaction) in variants:
                r = run_ours(model_dir, w, info, packing=packing, compaction=compaction)
                if name == "default":  # the same program as the variant it resolves to, run again
                    r["framework"] = r["framework"].replace("dapo_jax", "dapo_jax default:", 1)
                before = _set_peak(r, before)
                r["update_peak_fraction"] = r["update_flops_per_s"] / r["peak_flops_per_s"]
                results.append(r)
            for name, python in peers.items():
                r = run_peer(name, python, model_dir, w, size, args.peer_timeout)
                before = _set_peak(r, before)
                if "error" not in r:  # FLOP/s from the sequences each update trained on, as for ours
                    seqs, upd = r.pop("seq_lengths_per_step", None), r.pop("update_s_all", None)
                    if seqs and upd:
                        r["update_flops_per_s"] = flops_rate(info, seqs, upd)
                        r["update_peak_fraction"] = r["update_flops_per_s"] / r["peak_flops_per_s"]
                results.append(r)
            best = add_ratios(results)
            print(f"  {'framework':<30} {'step_s':>8} {'vs ours':>7} {'gen_s':>8} {'update_s':>8} {'host_s':>8} "
                  f"{'mean_len':>7} {'GFLOP/s':>7} {'%peak':>6} {'compiles':>6} {'peak':>6} {'1st_step':>8}")
            for r in results:
                print(fmt_row(r, best), flush=True)
            for r in results:
                if "packed_token_fraction" in r:
                    print(f"  {r['framework']}: the packed rows held {100 * r['packed_token_fraction']:.1f}% of the "
                          f"sequences' tokens (shared prompts); GFLOP/s and %peak count them all", flush=True)
            for r in results:
                r.update(size=size, params=info["params"], start_peak_flops_per_s=peak, load_before=load_before)
                emit(r)
                all_results.append(r)
    if args.json:
        Path(args.json).write_text("".join(json.dumps(r) + "\n" for r in all_results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
