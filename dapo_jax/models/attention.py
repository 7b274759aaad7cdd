"""Attention without a KV cache (the update, the log-prob passes, the critic, the sampler's prefill), behind
one function with the oracle beside it.

    ids = mask_ids(attention_mask, segment_ids, branch_ids)          # [B, S] ids, never an [S, K] array
    out = attend(q, k, v, ids, implementation=resolve(cfg.attention, platform=..., seq_len=S))

`q` is `[B, S, H_kv, R, D]` (query head `h = kv * R + r`, as the decoder lays them out), `k, v` are
`[B, S, H_kv, D]`; the result is `[B, S, H_kv, R, D]` in `v`'s dtype. Query `i` sees key `j` when

    j <= i  and  seg[i] == seg[j]  and  (branch[j] == 0  or  branch[i] == branch[j])

with `seg` the canonical segment ids of `mask_ids`: a real token's sequence id (1 when nothing is
packed), and `-(i + 1)` for a padding token `i`, so padding sees only itself and no real token sees
padding. That is the decoder's documented mask (a padding query attends only to itself), stated per
token so that every implementation computes it block by block:

| name | where | memory | how |
|---|---|---|---|
| `reference` | anywhere | `[B, S, S]` mask and score blocks | causal query blocks, softmax in float32 (the oracle) |
| `blockwise` | anywhere | linear in S | online softmax over key blocks, custom VJP that recomputes (`blockwise_attention.py`) |
| `splash` | TPU | linear in S | Pallas splash attention with `SegmentIds` (`pallas_attention.py`) |
| `gpu_flash` | GPU | linear in S | Pallas GPU flash attention with segment ids (`pallas_attention.py`) |

`auto` picks splash on TPU, gpu_flash on GPU, and on CPU the reference below `CPU_BLOCKWISE_FROM`
keys and blockwise from there on (the faster of the two at that length: docs/benchmarks.md,
"Attention on CPU"). An explicit choice that cannot run on the backend is a one-line
`AttentionUnavailable`, never a silent fallback. The kernels cannot express `branch_ids` (shared
prompts): `supports_branches` says so, and the packed update then lays each response out with its own
copy of the prompt (docs/long_context.md says what that costs).
"""

from __future__ import annotations

import contextlib
import contextvars
import math

import jax
import jax.numpy as jnp

from dapo_jax.models import pallas_attention
from dapo_jax.models.attention_mask import MaskIds, allowed, mask_ids, slice_ids
from dapo_jax.models.blockwise_attention import blockwise_attention

_NEG_INF = -1e30  # finite, so a masked score times 0 stays 0

IMPLEMENTATIONS = ("reference", "blockwise", "splash", "gpu_flash")
CPU_BLOCKWISE_FROM = 8192  # keys; below it the reference was faster on a CPU (docs/benchmarks.md, "Attention on a CPU")
_PLATFORMS = {"splash": ("tpu",), "gpu_flash": ("gpu", "cuda", "rocm")}
_INTERPRET = contextvars.ContextVar("dapo_jax_pallas_interpret", default=False)


class AttentionUnavailable(ValueError):
    """An attention implementation that cannot run on this backend (one line, names the setting)."""


# --------------------------------------------------------------------------- choosing
def current_platform() -> str:
    """The platform the program being traced runs on: the ambient mesh's devices, else JAX's default
    backend. `dapo-jax plan` compiles for a TPU slice from a CPU host under a mesh of TPU devices."""
    mesh = jax.sharding.get_abstract_mesh()
    if not mesh.empty and getattr(mesh, "abstract_device", None) is not None:
        return mesh.abstract_device.platform
    return jax.default_backend()


def resolve(name: str, *, platform: str, seq_len: int) -> str:
    """The implementation `name` (`auto` or one of `IMPLEMENTATIONS`) runs as on `platform` for `seq_len`
    keys; raises `AttentionUnavailable` when an explicit choice cannot run there."""
    if name == "auto":
        if platform == "tpu":
            return "splash"
        if platform in _PLATFORMS["gpu_flash"]:
            return "gpu_flash"
        return "blockwise" if seq_len >= CPU_BLOCKWISE_FROM else "reference"
    if name not in IMPLEMENTATIONS:
        raise AttentionUnavailable(f"model.attention={name!r} is not one of {('auto', *IMPLEMENTATIONS)}")
    needs = _PLATFORMS.get(name)
    if needs and platform not in needs and not _INTERPRET.get():
        raise AttentionUnavailable(f"model.attention={name} needs a {needs[0].upper()} but this program runs on "
                                   f"{platform}: use model.attention=auto or blockwise")
    return name


def supports_branches(implementation: str) -> bool:
    """Whether `implementation` can attend with `branch_ids` (the packed update's shared prompts)."""
    return implementation in ("reference", "blockwise")


@contextlib.contextmanager
def pallas_interpret():
    """Runs the Pallas kernels (splash, gpu_flash) in interpret mode, on any backend: for tests on a CPU."""
    token = _INTERPRET.set(True)
    try:
        yield
    finally:
        _INTERPRET.reset(token)


def describe(requested: str, platform: str, programs: dict[str, int]) -> str:
    """One line naming the implementation each program's attention runs as: `programs` maps a program's
    name to its sequence length (keys per row). Raises `AttentionUnavailable` like `resolve`."""
    parts = [f"{name} ({n} tokens) {resolve(requested, platform=platform, seq_len=n)}" for name, n in programs.items()]
    return f"attention (model.attention={requested} on {platform}): " + ", ".join(parts)


# --------------------------------------------------------------------------- the entry point
def attend(q: jax.Array, k: jax.Array, v: jax.Array, ids: MaskIds, *, implementation: str) -> jax.Array:
    """Self-attention of the S tokens over themselves (shapes in the module docstring)."""
    if implementation == "reference":
        return reference_attention(q, k, v, ids)
    if implementation == "blockwise":
        return blockwise_attention(q, k, v, ids)
    if ids.branch_ids is not None:
        raise AttentionUnavailable(f"model.attention={implementation} cannot attend with branch_ids (shared "
                                   f"prompts): pack without optim.packing_share_prompts")
    kernel = {"splash": pallas_attention.splash, "gpu_flash": pallas_attention.gpu_flash}[implementation]
    return kernel(q, k, v, ids.segment_ids, interpret=_INTERPRET.get())


# --------------------------------------------------------------------------- the reference (the oracle)
ATTENTION_BLOCK = 64  # smallest query block of the reference; at most MAX_ATTENTION_BLOCKS blocks
MAX_ATTENTION_BLOCKS = 8


def causal_blocks(s: int) -> list[tuple[int, int]]:
    """`[(lo, hi)]`: the S queries in blocks. Every query's keys lie at or before it (the mask is causal
    whatever else it holds), so block `[lo, hi)` attends to keys `[0, hi)` only: with n blocks the
    scores cover (n+1)/2n of the S x S square, the same values (the keys left out are masked ones,
    whose weight is exactly 0). Each block is its own few kernels to compile: on the main job's packed
    chunks (rows of 192: 3 blocks of 64, 67% of the square) forward + backward takes about a fifth less
    time than one block (two probes put blocks of 64 at 0.80x), and blocks of 16 (8 of 24, 56%) saved about
    5% more per chunk but took the chunk's compilation from 4 s to 11-15 s (docs/benchmarks.md, "Causal
    attention blocks", "The first minute")."""
    n = max(1, min(MAX_ATTENTION_BLOCKS, s // ATTENTION_BLOCK))
    size = -(-s // n)
    return [(lo, min(lo + size, s)) for lo in range(0, s, size)]


def reference_attention(q, k, v, ids: MaskIds) -> jax.Array:
    """Softmax attention in causal query blocks, each over its `[B, Sq, hi]` mask built from the ids."""
    s = q.shape[1]
    pos = jnp.arange(s)
    return jnp.concatenate([
        softmax_attention(q[:, lo:hi], k[:, :hi], v[:, :hi], allowed(slice_ids(ids, lo, hi), slice_ids(ids, 0, hi),
                                                                     pos[lo:hi], pos[:hi]))
        for lo, hi in causal_blocks(s)], axis=1)


def softmax_attention(q, k, v, ok):
    """Softmax attention of `q [B, Sq, Hkv, R, D]` over `k, v [B, K, Hkv, D]` where `ok [B, Sq, K]`;
    scores and softmax in float32, the probabilities cast to `v`'s dtype for the value matmul."""
    scores = jnp.einsum("bsgrd,bkgd->bgrsk", q, k, preferred_element_type=jnp.float32)
    scores = scores / math.sqrt(q.shape[-1])
    scores = jnp.where(ok[:, None, None], scores, _NEG_INF)
    probs = jax.nn.softmax(scores, axis=-1).astype(v.dtype)
    return jnp.einsum("bgrsk,bkgd->bsgrd", probs, v)


__all__ = ["AttentionUnavailable", "CPU_BLOCKWISE_FROM", "IMPLEMENTATIONS", "MaskIds", "allowed", "attend",
           "causal_blocks", "current_platform", "describe", "mask_ids", "pallas_interpret", "reference_attention", "resolve",
           "softmax_attention", "supports_branches"]
