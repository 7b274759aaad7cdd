"""A batch whose token entropies tie, and an independent NumPy / float64 reference of the high-entropy
mask and the loss over it: shared by the unpacked (`test_train_step.py`) and packed
(`test_packed_step.py`) updates' tests.

The G responses of a prompt share their first token's context (the prompt), so the first response
token's entropy is the same for all G of them: G-way ties, as in every real batch. The quantile q is
chosen so that the (1 - q) quantile falls inside one such tie (between two equal sorted values), the
threshold then equals the tied value and all G tokens are kept (`h >= threshold`). An update that
compares the threshold with entropies recomputed in another program (last bits differ) drops some.
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from dapo_jax.models.decoder import Decoder
from dapo_jax.training.update.train_step import Batch

P, G, S, T = 4, 4, 6, 6
EPS_LOW, EPS_HIGH = 0.2, 0.28


def model() -> Decoder:
    """The embedded tiny model (dapo_jax/assets/tiny_base, trained: its token entropies are spread
    out, so ties are the only near-equal values). On it the two-pass update kept 11, 11 and 15 of a
    batch's tokens at micro_batches 1, 2, 4 (CPU, float32)."""
    from dapo_jax.models.hf_io import load_pretrained
    from dapo_jax.training.config.paths import REPO_ROOT

    return load_pretrained(REPO_ROOT / "dapo_jax" / "assets" / "tiny_base")


def batch(vocab_size: int, seed: int = 0) -> Batch:
    rng, V = np.random.default_rng(seed), vocab_size
    lengths = rng.integers(2, T + 1, (P, G))
    mask = (np.arange(T) < lengths[..., None]).astype(np.float32)
    adv = np.repeat(rng.normal(size=(P, G, 1)), T, axis=2).astype(np.float32) * mask
    return Batch(prompt_ids=jnp.asarray(rng.integers(1, V, (P, S)), jnp.int32), prompt_mask=jnp.ones((P, S), jnp.int32),
                 response_ids=jnp.asarray(rng.integers(1, V, (P, G, T)), jnp.int32), response_mask=jnp.asarray(mask),
                 old_logp=jnp.asarray(-3.0 + 0.3 * rng.normal(size=(P, G, T)) * mask, jnp.float32),
                 advantages=jnp.asarray(adv), ref_logp=jnp.zeros((P, G, T), jnp.float32))


def float64_logprobs(m: Decoder, b: Batch) -> tuple[np.ndarray, np.ndarray]:
    """`(logp, entropy)` `[P, G, T]` in float64 from each sequence's logits, computed one sequence at a
    time (the model's float32 forward; softmax, log-probability and entropy in NumPy float64)."""
    w = np.asarray(m.output_embedding(), np.float64)  # [d, V]
    graphdef, params = nnx.split(m)
    forward = jax.jit(lambda params, ids: nnx.merge(graphdef, params)(
        ids, jnp.arange(S + T)[None], jnp.ones((1, S + T), jnp.int32))[0])
    logp, ent = np.zeros((P, G, T)), np.zeros((P, G, T))
    for p in range(P):
        for g in range(G):
            hidden = forward(params, jnp.concatenate([b.prompt_ids[p], b.response_ids[p, g]])[None])
            z = np.asarray(hidden[0, S - 1:S + T - 1], np.float64) @ w  # position S-1+t predicts token t
            z -= z.max(-1, keepdims=True)
            logq = z - np.log(np.exp(z).sum(-1, keepdims=True))
            logp[p, g] = logq[np.arange(T), np.asarray(b.response_ids[p, g])]
            ent[p, g] = -(np.exp(logq) * logq).sum(-1)
    return logp, ent


def tied_quantile(entropy: np.ndarray, mask: np.ndarray) -> tuple[float, float]:
    """`(q, tied value)`: a q whose (1 - q) quantile lies between two equal entropies (a first-token tie of
    one group), the tie with the widest gap to its nearest other value (asserted well above float32
    rounding, so that the float32 update and this float64 reference order every token alike)."""
    h = np.sort(entropy[mask > 0])
    n, best = len(h), None
    for p in range(P):
        v = entropy[p, 0, 0]
        a = int(np.searchsorted(h, v, side="left"))
        assert np.sum(h == v) == G, "the G first tokens of a group tie, exactly"
        if not 0 < a < n - G:  # the lowest or highest values: no neighbour on one side
            continue
        gap = min(v - h[a - 1], h[a + G] - v)
        if best is None or gap > best[0]:
            best = (gap, a, v)
    assert best is not None, "no tie inside the range of entropies"
    gap, a, v = best
    assert gap > 1e-4, f"no tie clear of its neighbours (gap {gap})"
    return 1.0 - (a + 0.5) / (n - 1), float(v)


def reference(m: Decoder, b: Batch) -> dict:
    """The whole batch's high-entropy mask and clipped-surrogate token mean over it, in float64."""
    logp, ent = float64_logprobs(m, b)
    mask = np.asarray(b.response_mask, np.float64)
    q, tie = tied_quantile(ent, mask)
    threshold = np.quantile(ent[mask > 0], 1.0 - q)
    assert threshold == tie
    keep = mask * (ent >= threshold)
    ratio = np.exp(logp - np.asarray(b.old_logp, np.float64))
    adv = np.asarray(b.advantages, np.float64)
    ell = -np.minimum(ratio * adv, np.clip(ratio, 1 - EPS_LOW, 1 + EPS_HIGH) * adv)
    return {"q": q, "keep": keep, "kept_fraction": keep.sum() / mask.sum(), "loss": (ell * keep).sum() / keep.sum(),
            "ties_kept": int(keep[:, :, 0][ent[:, :, 0] == tie].sum())}
