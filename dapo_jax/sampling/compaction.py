"""Active-row compaction: rows that finish early stop costing decode forwards.

Response lengths in long chain-of-thought RL are ragged (a mean well under `max_new_tokens`, a long
tail), and a batched decode runs until its longest row ends: once most rows have emitted their EOS,
most of each forward is padding. Every row of a rollout is at the same decode step `t`, so no
per-row positions are needed to drop them: when the number of unfinished rows falls to at most
half the current batch, the rollout gathers the unfinished rows (their response caches, logits,
token and log-prob buffers, their pre-drawn uniforms and their prompt's cache) into a batch of half
the size and goes on decoding. The batch goes through stages `B, B/2, B/4, ...` down to a floor,
each a static shape inside the same `jit` (one compilation per prompt bucket, as before); finished
rows are scattered back to `[B, T]` at every compaction and at the end.

The uniforms of every (row, step) are drawn before decoding and follow their row when it moves, so
a compacted rollout draws the same tokens as the uncompacted one for the same key, with the same
log-probs and entropies up to float rounding (the rows' matmuls are batched differently).

After the first compaction a row no longer shares its prompt's cache with the other `G - 1`
samples: each stage holds a gathered copy (`[B_s, ...]`, `G = 1` in the decode layout), at most
half the rows' worth of prompt slots.

On a mesh, compaction never moves a row to another device. The batch dimension is split into
`ways` = "data" x "fsdp" contiguous groups of rows, one per batch device, and each group compacts on
its own: a stage keeps `B_s / ways` rows of every group, and the rollout moves on to the next stage
once no group has more unfinished rows than that stage keeps. The gathers are then batched over the
groups, which XLA partitions without communication. A gather over the whole batch would not be: XLA
all-gathers the operand first, so every device would hold every row's response cache (for Qwen2.5-7B
at 20,480 tokens on v5p-32, 110 GiB of temporaries a device against a 17.5 GiB cache). With one group
(no mesh) the rule is the global one. A stage size must be a multiple of `ways`, so each device keeps
an equal slice; where the batch cannot halve under that rule there is no compaction (and a warning).

Continuous batching (refilling finished rows with new prompts inside a rollout, and handing groups
to dynamic sampling as they complete) is `continuous.py`; the two are alternatives.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp

from dapo_jax.models.decode import PromptCache, ResponseCache

# At most this many stages (B, B/2, B/4, B/8): each later stage compiles one more copy of the decode
# loop (on a CPU each costs about half the first stage's four block loops), and below B/8 a stage
# saves at most B/16 rows per step.
MAX_STAGES = 4


def stage_sizes(rows: int, *, enabled: bool, min_rows: int, ways: int = 1) -> list[int]:
    """The batch size of each decode stage: `rows`, then halves that stay >= `min_rows` and multiples of `ways`.

    `[rows]` (no compaction) when `enabled` is false or the first half already breaks a rule; that
    case warns when compaction was asked for."""
    sizes = [rows]
    while enabled and len(sizes) < MAX_STAGES:
        half, odd = divmod(sizes[-1], 2)
        if odd or half < max(min_rows, 1) or half % ways:
            break
        sizes.append(half)
    if enabled and len(sizes) == 1:
        warnings.warn(
            f"rollout.compaction: a batch of {rows} rows cannot halve to >= compaction_min_rows={min_rows} rows "
            f"in multiples of the {ways} batch devices; decoding without compaction",
            stacklevel=2,
        )
    return sizes


def live_first(done: jax.Array, size: int, ways: int = 1) -> jax.Array:
    """`[ways, size // ways]`: for each of the `ways` contiguous groups of rows, the group-local indices
    of the rows to keep: every unfinished row (in row order), then finished ones.

    The caller only compacts once no group has more than `size // ways` unfinished rows, or once
    decoding is over (then every row's output has already been written back)."""
    groups = done.reshape(ways, done.shape[0] // ways)
    return jnp.argsort(groups, axis=-1, stable=True)[:, : size // ways].astype(jnp.int32)


def live_per_group(done: jax.Array, ways: int = 1) -> jax.Array:
    """The most unfinished rows in any of the `ways` contiguous groups of `done` `[B]`."""
    return jnp.max(jnp.sum(~done.reshape(ways, done.shape[0] // ways), axis=-1))


def take_rows(x: jax.Array, local: jax.Array) -> jax.Array:
    """Rows of `x` `[B, ...]` by group-local indices `local` `[ways, m]` -> `[ways * m, ...]`: a gather
    batched over the groups, so no row leaves its device."""
    ways, m = local.shape
    grouped = x.reshape(ways, x.shape[0] // ways, *x.shape[1:])
    return jax.vmap(lambda g, i: jnp.take(g, i, axis=0))(grouped, local).reshape(ways * m, *x.shape[1:])


def put_rows(out: jax.Array, local: jax.Array, values: jax.Array) -> jax.Array:
    """`out` `[B, ...]` with `values` `[ways * m, ...]` written at group-local rows `local` `[ways, m]`."""
    ways, m = local.shape
    grouped = out.reshape(ways, out.shape[0] // ways, *out.shape[1:])
    new = values.reshape(ways, m, *values.shape[1:])
    return jax.vmap(lambda g, i, v: g.at[i].set(v))(grouped, local, new).reshape(out.shape)


def _by_row(x: jax.Array) -> jax.Array:
    """`[P, H_kv, G, ...]` (the decode layout) -> `[P*G, H_kv, ...]`, row `b = p*G + g`."""
    x = jnp.swapaxes(x, 1, 2)
    return x.reshape(x.shape[0] * x.shape[1], *x.shape[2:])


def gather_response_cache(cache: ResponseCache, local: jax.Array) -> ResponseCache:
    """Rows `local` (group-local, `[ways, m]`) of `cache`, one row per "prompt" (`[ways * m, H_kv, 1, ...]`)."""
    take = lambda x: take_rows(_by_row(x), local)[:, :, None]
    return ResponseCache(k=tuple(map(take, cache.k)), v=tuple(map(take, cache.v)))


def gather_prompt_cache(prompt: PromptCache, prompt_index: jax.Array, ways: int = 1) -> PromptCache:
    """A copy of `prompt` with one entry per row: entry i is prompt `prompt_index[i]` (`[ways * m]`, the
    rows of each group in its own slice). Where the prompts split evenly over the groups, a row's prompt
    is in its own group and the gather stays within it; otherwise it is a gather over all prompts."""
    n = prompt.lengths.shape[0]
    if n % ways:
        take = lambda x: jnp.take(x, prompt_index, axis=0)
    else:
        local = (prompt_index % (n // ways)).reshape(ways, -1)
        take = lambda x: take_rows(x, local)
    return PromptCache(k=tuple(map(take, prompt.k)), v=tuple(map(take, prompt.v)), lengths=take(prompt.lengths))
