"""Sequence packing for a padding-free update (host side, NumPy).

A rollout batch is `[P, S]` left-padded prompts and `[P, G, T]` right-padded responses; the
update's work on it is `P·G·(S+T)` tokens whatever the real lengths. `pack_groups` lays the real
tokens of every (prompt, response) sequence end to end in rows of a fixed length `L`, in
fixed-shape "chunks" of `R` rows:

    tokens      [R, L] int32   prompt tokens then response tokens of each sequence, 0 after the last
    segment_ids [R, L] int32   1, 2, ... per sequence within a row, 0 on padding
    positions   [R, L] int32   0, 1, ... within each sequence (RoPE positions, as unpacked)
    targets     [R, L] int32   the next token of the same sequence (0 at a sequence's last token)
    index       [P, G, T] int32  flat position `r·L + j` whose hidden state predicts response token t
    valid       [P, G, T] bool   response token (p, g, t) is in this chunk
    groups      [P] bool         the chunk holds group p (all its non-empty sequences)

Groups are never split across chunks (so any group statistic of the objective sees a whole group
in one chunk) and a sequence is never split across rows. Groups are placed first-fit-decreasing
(by their token count) into chunks, each group's sequences first-fit-decreasing into the chunk's
rows. A sequence whose response mask is all zero carries no loss and is left out; a response mask
must otherwise be a prefix (ones then zeros), which is what the sampler and every mask edit produce.

`pack_with_tail` also allows a second, shorter chunk shape of `tail_rows` rows for what is left over:
the groups of the last `R`-row chunk are packed again into `tail_rows`-row chunks when those take fewer
rows. A step's token count rarely fills its last chunk; with a tail the update computes fewer empty
positions there (two shapes, so two compilations of the update's chunk function).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PackedChunk(NamedTuple):
    tokens: np.ndarray  # [R, L] int32
    segment_ids: np.ndarray  # [R, L] int32, 0 = padding
    positions: np.ndarray  # [R, L] int32
    targets: np.ndarray  # [R, L] int32
    index: np.ndarray  # [P, G, T] int32
    valid: np.ndarray  # [P, G, T] bool
    groups: np.ndarray  # [P] bool


def sequence_lengths(prompt_mask: np.ndarray, response_mask: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(prompt lengths [P], response lengths [P, G]); raises if a response mask is not a prefix."""
    pm = np.asarray(prompt_mask) > 0
    rm = np.asarray(response_mask) > 0
    n = rm.sum(-1)
    prefix = np.arange(rm.shape[-1]) < n[..., None]
    if not np.array_equal(prefix, rm):
        bad = tuple(int(i) for i in np.argwhere((prefix != rm).any(-1))[0])
        raise ValueError(f"packing needs each response mask to be ones then zeros; response {bad} is not")
    return pm.sum(-1), n


def pack_groups(prompt_ids, prompt_mask, response_ids, response_mask, *, rows: int, length: int) -> list[PackedChunk]:
    """Packs the batch's non-empty sequences into chunks of `rows` x `length` (see the module doc).

    Every sequence must fit in one row (`length >= its prompt + response tokens`; `S + T` always
    does) and every group in one chunk (`rows >= G` always does with `length >= S + T`).
    """
    prompt_ids, response_ids = np.asarray(prompt_ids), np.asarray(response_ids)
    plen, rlen = sequence_lengths(prompt_mask, response_mask)
    p_count, g_count, t_max = response_ids.shape
    if np.any(plen[rlen.sum(-1) > 0] == 0):
        raise ValueError("packing: a prompt with responses to train on has no real token")
    seq_len = np.where(rlen > 0, plen[:, None] + rlen, 0)  # [P, G]
    if seq_len.max(initial=0) > length:
        raise ValueError(f"packing: a sequence of {seq_len.max()} tokens does not fit a row of {length}")

    def place(free: list[int], group: int) -> list[tuple[int, int, int]] | None:
        """First-fit-decreasing of the group's sequences into rows with `free` tokens left; returns
        [(g, row, offset)] (and updates `free`), or None when they do not all fit."""
        trial, out = list(free), []
        for g in sorted(np.flatnonzero(seq_len[group]), key=lambda g: (-seq_len[group, g], g)):
            row = next((r for r, f in enumerate(trial) if f >= seq_len[group, g]), None)
            if row is None:
                return None
            out.append((int(g), row, length - trial[row]))
            trial[row] -= int(seq_len[group, g])
        free[:] = trial
        return out

    chunks: list[tuple[list[int], list]] = []  # (free tokens per row, [(p, g, row, offset)])
    totals = seq_len.sum(-1)
    for p in sorted(np.flatnonzero(totals), key=lambda p: (-totals[p], p)):
        for free, placed in chunks:
            spots = place(free, p)
            if spots is not None:
                break
        else:
            free, placed = [length] * rows, []
            spots = place(free, p)
            if spots is None:
                raise ValueError(f"packing: group {p} ({totals[p]} tokens in {np.count_nonzero(seq_len[p])} "
                                 f"sequences) does not fit one chunk of {rows} rows x {length}")
            chunks.append((free, placed))
        placed.extend((int(p), g, r, o) for g, r, o in spots)
    prompt_real = np.asarray(prompt_mask) > 0
    return [_build(placed, prompt_ids, prompt_real, plen, response_ids, rlen, rows, length, t_max)
            for _, placed in chunks]


def _build(placed, prompt_ids, prompt_real, plen, response_ids, rlen, rows, length, t_max) -> PackedChunk:
    p_count, g_count = rlen.shape
    tokens = np.zeros((rows, length), np.int32)
    segs = np.zeros((rows, length), np.int32)
    pos = np.zeros((rows, length), np.int32)
    targets = np.zeros((rows, length), np.int32)
    index = np.zeros((p_count, g_count, t_max), np.int32)
    valid = np.zeros((p_count, g_count, t_max), bool)
    groups = np.zeros(p_count, bool)
    next_seg = np.ones(rows, np.int32)
    for p, g, r, o in sorted(placed, key=lambda x: (x[2], x[3])):
        s_len, n = int(plen[p]), int(rlen[p, g])
        seq = np.concatenate([prompt_ids[p][prompt_real[p]], response_ids[p, g, :n]])
        end = o + s_len + n
        tokens[r, o:end] = seq
        segs[r, o:end] = next_seg[r]
        next_seg[r] += 1
        pos[r, o:end] = np.arange(s_len + n)
        targets[r, o:end - 1] = seq[1:]
        index[p, g, :n] = r * length + o + s_len - 1 + np.arange(n)
        valid[p, g, :n] = True
        groups[p] = True
    return PackedChunk(tokens, segs, pos, targets, index, valid, groups)


def pack_with_tail(prompt_ids, prompt_mask, response_ids, response_mask, *, rows: int, tail_rows: int,
                   length: int) -> list[PackedChunk]:
    """`pack_groups` into `rows`-row chunks, then the last chunk's groups again into `tail_rows`-row
    chunks when they fit in fewer rows in all (and each of their groups fits one tail chunk)."""
    chunks = pack_groups(prompt_ids, prompt_mask, response_ids, response_mask, rows=rows, length=length)
    if not chunks or not 0 < tail_rows < rows:
        return chunks
    only_last = np.asarray(response_mask) * chunks[-1].groups[:, None, None]
    try:
        tail = pack_groups(prompt_ids, prompt_mask, response_ids, only_last, rows=tail_rows, length=length)
    except ValueError:  # a group of the last chunk does not fit tail_rows rows
        return chunks
    return chunks[:-1] + tail if len(tail) * tail_rows < rows else chunks
