"""Per-token log-probabilities and entropies without the `[B, T, V]` logits tensor.

For a policy with final hidden states `h [B, T, d]` and output embedding `W [d, V]`, the
training loss needs, at every position `t` with target token `y_t`,

    z_t   = h_t · W / τ                                    (τ = the sampling temperature)
    lse_t = log Σ_v exp(z_{t,v})
    logp_t = z_{t,y_t} − lse_t                              (= log_softmax(z_t)[y_t])
    H_t   = −Σ_v p_{t,v} log p_{t,v},   p_t = softmax(z_t)  (= lse_t − Σ_v p_{t,v} z_{t,v})

Materialising `z` costs `B·T·V·4` bytes (B=8, T=2048, V=151,936: 10 GB), and autodiff keeps a
copy of the softmax for the backward pass on top. `token_logprobs` instead walks the sequence in
chunks of `chunk_size` positions (and, optionally, the vocabulary in chunks of `vocab_chunk`
columns with an online log-sum-exp), so that at most `B·chunk_size·V` (or `B·chunk_size·vocab_chunk`)
logits exist at once. Its custom VJP saves only `lse` and `H` (`[B, T]`) and recomputes each
chunk's logits in the backward pass, using

    ∂logp_t/∂z_{t,v} = 1[v = y_t] − p_{t,v}
    ∂H_t/∂z_{t,v}    = −p_{t,v} (log p_{t,v} + H_t)

so the gradient (w.r.t. `h` and `W`, through `logp` and through the entropy bonus) is exact and
its memory is bounded the same way. Logits are accumulated in float32 whatever the input dtype
(bf16 matmuls use `preferred_element_type=float32`), and divided by τ exactly as the sampler does.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp

from dapo_jax.models.decoder import positions_from_mask

# Masks padded vocabulary columns: finite (not -inf) so that 0 * _NEG stays 0 in the entropy sums.
_NEG = -1e30
DEFAULT_CHUNK_SIZE = 128


# --------------------------------------------------------------------------- reference
def naive_token_logprobs(hidden, w, targets, *, temperature=1.0):
    """The full-logits reference: `log_softmax(h·W/τ)[y]` and the entropy, through `[..., T, V]` logits.

    Args:
      hidden: `[..., T, d]`; w: `[d, V]`; targets: `[..., T]` int in `[0, V)`.
    Returns:
      `(logp [..., T] float32, entropy [..., T] float32)`.
    """
    z = _logits(hidden, w, temperature)
    logp_all = jax.nn.log_softmax(z, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None].astype(jnp.int32), axis=-1)[..., 0]
    entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
    return logp, entropy


def _logits(h, w, temperature):
    """`h [..., d] · w [d, v] / τ` in float32; bf16 operands stay bf16 inside the matmul."""
    z = jnp.einsum("...d,dv->...v", h, w, preferred_element_type=jnp.float32)
    return z / temperature


# --------------------------------------------------------------------------- chunked kernel
def token_logprobs(
    hidden: jax.Array,
    w: jax.Array,
    targets: jax.Array,
    *,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    vocab_chunk: int | None = None,
) -> tuple[jax.Array, jax.Array]:
    """Per-token `log π(y_t)` and entropy `H_t` of `softmax(h·W/τ)`, in bounded memory.

    Args:
      hidden: `[..., T, d]` final (normed) hidden states, float32 or bf16.
      w: `[d, V]` output embedding (`Decoder.output_embedding()`); promoted with `hidden` to one
        compute dtype for the matmul, whose result is float32.
      targets: `[..., T]` integer tokens in `[0, V)`; an out-of-range target gives `logp = NaN`.
      temperature: τ > 0, the sampling temperature (logits are divided by it, as the sampler does).
      chunk_size: sequence positions per chunk; peak memory ~ `B·chunk_size·V` floats. `T` need
        not be a multiple (the tail is padded internally).
      vocab_chunk: if set, the vocabulary is also walked in chunks of this many columns with an
        online log-sum-exp (peak ~ `B·chunk_size·vocab_chunk`); `V` need not be a multiple.

    Returns:
      `(logp, entropy)`, both `[..., T]` float32. Differentiable w.r.t. `hidden` and `w` (custom
      VJP that recomputes each chunk's logits); `targets` and `temperature` get no gradient.
    """
    if hidden.ndim < 2:
        raise ValueError(f"hidden must be [..., T, d], got shape {hidden.shape}")
    if w.ndim != 2 or w.shape[0] != hidden.shape[-1]:
        raise ValueError(f"w must be [d={hidden.shape[-1]}, V], got shape {w.shape}")
    if targets.shape != hidden.shape[:-1]:
        raise ValueError(f"targets must be {hidden.shape[:-1]} (hidden's leading shape), got {targets.shape}")
    if not jnp.issubdtype(targets.dtype, jnp.integer):
        raise ValueError(f"targets must be integer token ids, got dtype {targets.dtype}")
    if int(chunk_size) < 1:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    if vocab_chunk is not None and int(vocab_chunk) < 1:
        raise ValueError(f"vocab_chunk must be None or a positive integer, got {vocab_chunk!r}")

    lead, (t, d), v = hidden.shape[:-2], hidden.shape[-2:], w.shape[1]
    if t == 0 or hidden.size == 0:
        return jnp.zeros(targets.shape, jnp.float32), jnp.zeros(targets.shape, jnp.float32)
    dtype = jnp.promote_types(hidden.dtype, w.dtype)
    h = hidden.astype(dtype).reshape(-1, t, d)
    y = targets.astype(jnp.int32).reshape(-1, t)

    c = min(int(chunk_size), t)
    n_chunks = -(-t // c)
    pad = n_chunks * c - t
    if pad:
        h = jnp.pad(h, ((0, 0), (0, pad), (0, 0)))
        y = jnp.pad(y, ((0, 0), (0, pad)))
    vc = None if vocab_chunk is None or int(vocab_chunk) >= v else int(vocab_chunk)

    # [B, n*C, ...] -> [n, B, C, ...]: chunks along T keep a batch-sharded layout intact.
    h = jnp.moveaxis(h.reshape(h.shape[0], n_chunks, c, d), 1, 0)
    y = jnp.moveaxis(y.reshape(y.shape[0], n_chunks, c), 1, 0)
    tau = jnp.asarray(temperature, jnp.float32)
    logp, entropy = _chunked(h, w.astype(dtype), y, tau, vc)

    def unchunk(x):
        return jnp.moveaxis(x, 0, 1).reshape(-1, n_chunks * c)[:, :t].reshape(*lead, t)

    logp = jnp.where((targets >= 0) & (targets < v), unchunk(logp), jnp.nan)
    return logp, unchunk(entropy)


def _vocab_starts(v, vc):
    """First column of each vocabulary block; the last block is shifted left to end at `V`, and the
    columns it shares with its neighbour are masked out in it (no padded copy of `W` is ever made)."""
    n_v = -(-v // vc)
    return jnp.minimum(jnp.arange(n_v) * vc, v - vc), jnp.arange(n_v) * vc


def _vocab_block(w, start, first_new, vc):
    """`(W[:, start:start+vc], cols [vc], new [vc])`: `new` marks columns no earlier block covered."""
    cols = start + jnp.arange(vc)
    return jax.lax.dynamic_slice_in_dim(w, start, vc, axis=1), cols, cols >= first_new


def _chunk_stats(h, w, y, tau, vc):
    """One sequence chunk `h [B, C, d]`: returns `(logp, entropy, lse)`, each `[B, C]` float32."""
    if vc is None:
        z = _logits(h, w, tau)
        lse = jax.nn.logsumexp(z, axis=-1)
        logp_all = z - lse[..., None]
        entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
        z_y = jnp.take_along_axis(z, y[..., None], axis=-1, mode="clip")[..., 0]
        return z_y - lse, entropy, lse

    # Online log-sum-exp over vocabulary blocks: m = running max, s = Σ exp(z − m),
    # a = Σ exp(z − m)(z − m) (so that H = log s − a / s), z_y = the target's logit.
    def step(carry, starts):
        m, s, a, z_y = carry
        w_j, cols, new = _vocab_block(w, *starts, vc)
        z = jnp.where(new, _logits(h, w_j, tau), _NEG)
        m_new = jnp.maximum(m, jnp.max(z, axis=-1))
        scale = jnp.exp(m - m_new)
        e = jnp.exp(z - m_new[..., None])
        a = scale * (a + s * (m - m_new)) + jnp.sum(e * (z - m_new[..., None]), axis=-1)
        s = scale * s + jnp.sum(e, axis=-1)
        z_y = z_y + jnp.sum(jnp.where(new & (cols == y[..., None]), z, 0.0), axis=-1)
        return (m_new, s, a, z_y), None

    zeros = jnp.zeros(h.shape[:-1], jnp.float32)
    (m, s, a, z_y), _ = jax.lax.scan(step, (zeros + _NEG, zeros, zeros, zeros), _vocab_starts(w.shape[1], vc))
    lse = m + jnp.log(s)
    return z_y - lse, jnp.log(s) - a / s, lse


def _chunk_grads(h, w, y, tau, lse, entropy, g_logp, g_ent, dw, vc):
    """Recomputes one chunk's logits; returns `(dh [B, C, d] f32, dw + this chunk's dW [d, V] f32)`."""

    def grads(w_j, cols, new):
        log_p = _logits(h, w_j, tau) - lse[..., None]
        p = jnp.where(new, jnp.exp(log_p), 0.0)
        onehot = (new & (cols == y[..., None])).astype(jnp.float32)
        dz = g_logp[..., None] * (onehot - p) - g_ent[..., None] * p * (log_p + entropy[..., None])
        dz = (dz / tau).astype(h.dtype)  # ∂z/∂(h·W) = 1/τ; bf16 in, bf16 matmul
        dh = jnp.einsum("bcv,dv->bcd", dz, w_j, preferred_element_type=jnp.float32)
        return dh, jnp.einsum("bcd,bcv->dv", h, dz, preferred_element_type=jnp.float32)

    if vc is None:
        v = w.shape[1]
        dh, dw_c = grads(w, jnp.arange(v), jnp.ones((v,), bool))
        return dh, dw + dw_c

    def step(carry, starts):
        dh, dw = carry
        w_j, cols, new = _vocab_block(w, *starts, vc)
        dh_j, dw_j = grads(w_j, cols, new)  # dw_j is 0 on the columns an earlier block owns
        dw_old = jax.lax.dynamic_slice_in_dim(dw, starts[0], vc, axis=1)
        return (dh + dh_j, jax.lax.dynamic_update_slice_in_dim(dw, dw_old + dw_j, starts[0], axis=1)), None

    (dh, dw), _ = jax.lax.scan(step, (jnp.zeros(h.shape, jnp.float32), dw), _vocab_starts(w.shape[1], vc))
    return dh, dw


@partial(jax.custom_vjp, nondiff_argnums=(4,))
def _chunked(h, w, y, tau, vc):
    """`h [n, B, C, d]`, `y [n, B, C]` -> `(logp, entropy)` `[n, B, C]`."""
    logp, entropy, _ = jax.lax.map(lambda hy: _chunk_stats(hy[0], w, hy[1], tau, vc), (h, y))
    return logp, entropy


def _chunked_fwd(h, w, y, tau, vc):
    logp, entropy, lse = jax.lax.map(lambda hy: _chunk_stats(hy[0], w, hy[1], tau, vc), (h, y))
    return (logp, entropy), (h, w, y, tau, lse, entropy)


def _chunked_bwd(vc, residuals, cotangents):
    h, w, y, tau, lse, entropy = residuals
    g_logp, g_ent = cotangents

    def step(dw, chunk):
        h_c, y_c, lse_c, ent_c, g_logp_c, g_ent_c = chunk
        dh_c, dw = _chunk_grads(h_c, w, y_c, tau, lse_c, ent_c, g_logp_c, g_ent_c, dw, vc)
        return dw, dh_c.astype(h.dtype)

    dw, dh = jax.lax.scan(step, jnp.zeros(w.shape, jnp.float32), (h, y, lse, entropy, g_logp, g_ent))
    return dh, dw.astype(w.dtype), None, None


_chunked.defvjp(_chunked_fwd, _chunked_bwd)


# --------------------------------------------------------------------------- a diagnostic
def output_grad_norms(hidden: jax.Array, w: jax.Array, targets: jax.Array, *, temperature: float | jax.Array = 1.0,
                      chunk_size: int = DEFAULT_CHUNK_SIZE) -> jax.Array:
    """`‖∂ log π(y_t) / ∂W‖_F` `[..., T]` float32: how much one token's log-prob moves the output layer.

    With `z_t = h_t·W/τ`, `∂ log π(y_t)/∂W = h_t (e_{y_t} − p_t)ᵀ / τ`, a rank-one matrix, so its norm is
    `‖h_t‖ · ‖e_{y_t} − p_t‖ / τ` with `‖e_y − p‖² = 1 − 2 p_y + Σ_v p_v²`. No gradient flows through it. A
    policy-gradient surrogate weights each token's `∇ log π` by `A·ρ`; these norms, so weighted, say which
    tokens carry the output layer's gradient (objectives/diagnostics.py, `clip_grad_shares`). Chunked over
    positions as `token_logprobs` (peak `B·chunk_size·V` floats); `targets` must be in `[0, V)`.
    """
    if targets.shape != hidden.shape[:-1] or w.ndim != 2 or w.shape[0] != hidden.shape[-1]:
        raise ValueError(f"hidden {hidden.shape}, w {w.shape} and targets {targets.shape} must be [..., T, d], "
                         f"[d, V] and [..., T]")
    t, d = hidden.shape[-2:]
    if t == 0 or hidden.size == 0:
        return jnp.zeros(targets.shape, jnp.float32)
    dtype = jnp.promote_types(hidden.dtype, w.dtype)
    h = jax.lax.stop_gradient(hidden).astype(dtype).reshape(-1, t, d)
    y = targets.astype(jnp.int32).reshape(-1, t)
    w = jax.lax.stop_gradient(w).astype(dtype)
    c = min(int(chunk_size), t)
    n = -(-t // c)
    h = jnp.moveaxis(jnp.pad(h, ((0, 0), (0, n * c - t), (0, 0))).reshape(h.shape[0], n, c, d), 1, 0)
    y = jnp.moveaxis(jnp.pad(y, ((0, 0), (0, n * c - t))).reshape(y.shape[0], n, c), 1, 0)

    def chunk(hy):
        h_c, y_c = hy
        p = jax.nn.softmax(_logits(h_c, w, temperature), axis=-1)
        p_y = jnp.take_along_axis(p, y_c[..., None], axis=-1, mode="clip")[..., 0]
        sq = jnp.maximum(1.0 - 2.0 * p_y + jnp.sum(p * p, axis=-1), 0.0)
        return jnp.linalg.norm(h_c.astype(jnp.float32), axis=-1) * jnp.sqrt(sq) / temperature

    out = jax.lax.map(chunk, (h, y))
    return jnp.moveaxis(out, 0, 1).reshape(-1, n * c)[:, :t].reshape(targets.shape)


# --------------------------------------------------------------------------- training forward
def response_logprobs(
    model,
    prompt_ids: jax.Array,
    prompt_mask: jax.Array,
    response_ids: jax.Array,
    response_mask: jax.Array,
    *,
    temperature: float | jax.Array = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    vocab_chunk: int | None = None,
    grad_norms: bool = False,
) -> tuple[jax.Array, ...]:
    """`log π(response token)` and entropy at every response position: the trainer's forward pass.

    One model call on `concat(prompt, response)` with `positions_from_mask(concat(masks))`; the
    hidden state at position `S − 1 + t` predicts response token `t`, so logits are never formed
    for the prompt. Prompts are LEFT-padded (each needs at least one real token, the last slot),
    responses RIGHT-padded.

    Args:
      model: a `Decoder` (anything with `__call__(ids, positions, mask)`, `config.dtype` and
        `output_embedding()`).
      prompt_ids, prompt_mask: `[B, S]`, or `[P, S]` shared by `G` responses each when the
        response tensors are `[P, G, T]` (or `[P, G, S]`).
      response_ids, response_mask: `[B, T]` or `[P, G, T]`; mask 1 on real tokens (EOS included).
      temperature, chunk_size, vocab_chunk: as in `token_logprobs`.
      grad_norms: also return `output_grad_norms` (a diagnostic, no gradient).

    Returns:
      `(logp, entropy)` shaped like `response_ids`, float32, exactly 0 at padded response positions
      (`(logp, entropy, grad_norms)` with `grad_norms`).
    """
    if response_ids.shape != response_mask.shape:
        raise ValueError(f"response_mask {response_mask.shape} must match response_ids {response_ids.shape}")
    if prompt_ids.shape != prompt_mask.shape:
        raise ValueError(f"prompt_mask {prompt_mask.shape} must match prompt_ids {prompt_ids.shape}")
    out_shape = response_ids.shape
    if response_ids.ndim == 3:  # [P, G, T]: flatten to rows p*G + g
        p, g, _ = response_ids.shape
        if prompt_ids.ndim == 2:
            prompt_ids, prompt_mask = (jnp.repeat(x, g, axis=0) for x in (prompt_ids, prompt_mask))
        prompt_ids, prompt_mask = (x.reshape(p * g, -1) for x in (prompt_ids, prompt_mask))
        response_ids, response_mask = (x.reshape(p * g, -1) for x in (response_ids, response_mask))
    if response_ids.ndim != 2 or prompt_ids.ndim != 2 or prompt_ids.shape[0] != response_ids.shape[0]:
        raise ValueError(
            f"prompt_ids {prompt_ids.shape} and response_ids {response_ids.shape} must be [B, S] and "
            f"[B, T] with the same B (or [P, S] / [P, G, S] with [P, G, T])"
        )
    s, t = prompt_ids.shape[1], response_ids.shape[1]
    ids = jnp.concatenate([prompt_ids, response_ids], axis=1)
    mask = jnp.concatenate([prompt_mask, response_mask], axis=1).astype(jnp.int32)
    hidden, _ = model(ids, positions_from_mask(mask), mask)
    # Same casts as Decoder.logits, so the sampler's log-probs and these agree.
    w = model.output_embedding().astype(model.config.dtype)
    h = hidden[:, s - 1 : s + t - 1].astype(w.dtype)
    real = response_mask.astype(bool)
    targets = jnp.where(real, response_ids, 0)  # any pad id (even -1) is safe
    logp, entropy = token_logprobs(
        h, w, targets, temperature=temperature, chunk_size=chunk_size, vocab_chunk=vocab_chunk
    )
    logp = jnp.where(real, logp, 0.0)
    entropy = jnp.where(real, entropy, 0.0)
    if not grad_norms:
        return logp.reshape(out_shape), entropy.reshape(out_shape)
    norms = jnp.where(real, output_grad_norms(h, w, targets, temperature=temperature, chunk_size=chunk_size), 0.0)
    return logp.reshape(out_shape), entropy.reshape(out_shape), norms.reshape(out_shape)
