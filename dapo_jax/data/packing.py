"""Sequence packing for a padding-free update (host side, NumPy).

A rollout batch is `[P, S]` left-padded prompts and `[P, G, T]` right-padded responses; the
update's work on it is `P·G·(S+T)` tokens whatever the real lengths. `pack_groups` lays the real
tokens of every (prompt, response) sequence end to end in rows of a fixed length `L`, in
fixed-shape "chunks" of `R` rows:

    tokens      [R, L] int32   prompt tokens then response tokens of each sequence, 0 after the last
    segment_ids [R, L] int32   1, 2, ... per segment (a sequence, or a group's prompt and responses) in a row, 0 on padding
    positions   [R, L] int32   0, 1, ... within each sequence (RoPE positions, as unpacked)
    targets     [R, L] int32   the next token of the same sequence (0 at a sequence's last token)
    branch_ids  [R, L] int32   0 on the prompt's tokens but its last, 1, 2, ... per response in its segment
    index       [P, G, T] int32  flat position `r·L + j` whose hidden state predicts response token t
    valid       [P, G, T] bool   response token (p, g, t) is in this chunk
    groups      [P] bool         the chunk holds group p (all its non-empty sequences)

Groups are never split across chunks (so any group statistic of the objective sees a whole group
in one chunk) and a sequence is never split across rows. Groups are placed first-fit-decreasing
(by their token count) into chunks, each group's sequences first-fit-decreasing into the chunk's
rows. A sequence whose response mask is all zero carries no loss and is left out; a response mask
must otherwise be a prefix (ones then zeros), which is what the sampler and every mask edit produce.

Shared prompts (`share_prompts=True`): the G responses of a group all continue one prompt, so the
responses of a group that land in one row share one copy of it: the segment is the prompt's tokens
but the last (branch 0), then for each response the prompt's last token and the response (branch
1, 2, ...). The decoder's `branch_ids` let each branch attend to the prefix and to itself only, with
the positions a lone sequence has, so every response's log-probs and gradients are those of its own
(prompt, response) sequence while the prompt's other tokens are computed once per row, not once per
response. Without it each segment holds one response (branch 1), the same attention as a plain
causal sequence.

`pack_with_tail` also allows shorter chunk shapes for what is left over: the groups of the last
`R`-row chunk are packed again into chunks of a multiple of `tail_rows` rows when those take fewer
rows. A step's token count rarely fills its last chunk; with tails the update computes fewer empty
positions there (each height is one more compilation of the update's chunk function).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class PackedChunk(NamedTuple):
    tokens: np.ndarray  # [R, L] int32
    segment_ids: np.ndarray  # [R, L] int32, 0 = padding
    positions: np.ndarray  # [R, L] int32
    targets: np.ndarray  # [R, L] int32
    branch_ids: np.ndarray  # [R, L] int32, 0 = a segment's prefix
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


def pack_groups(prompt_ids, prompt_mask, response_ids, response_mask, *, rows: int, length: int,
                share_prompts: bool = False) -> list[PackedChunk]:
    """Packs the batch's non-empty sequences into chunks of `rows` x `length` (see the module doc).

    Every sequence must fit in one row (`length >= its prompt + response tokens`; `S + T` always
    does) and every group in one chunk (`rows >= G` always does with `length >= S + T`).
    share_prompts: a group's responses that land in one row share one copy of the prompt (see the module doc).
    """
    prompt_ids, response_ids = np.asarray(prompt_ids), np.asarray(response_ids)
    plen, rlen = sequence_lengths(prompt_mask, response_mask)
    if np.any(plen[rlen.sum(-1) > 0] == 0):
        raise ValueError("packing: a prompt with responses to train on has no real token")
    seq_len = np.where(rlen > 0, plen[:, None] + rlen, 0)  # [P, G]
    if seq_len.max(initial=0) > length:
        raise ValueError(f"packing: a sequence of {seq_len.max()} tokens does not fit a row of {length}")

    def place(free: list[int], group: int) -> list[tuple[int, int]] | None:
        """First-fit-decreasing of the group's sequences into rows with `free` tokens left (with
        `share_prompts`, first into a row that already holds the group's prompt, at the cost of the
        response and one token); returns [(g, row)] (and updates `free`), or None when they do not all fit."""
        trial, rows_with, out = list(free), set(), []
        for g in sorted(np.flatnonzero(seq_len[group]), key=lambda g: (-seq_len[group, g], g)):
            shared = int(rlen[group, g]) + 1  # the prompt's last token, then the response
            row = next((r for r in sorted(rows_with) if trial[r] >= shared), None) if share_prompts else None
            if row is None:
                row = next((r for r, f in enumerate(trial) if f >= seq_len[group, g]), None)
                if row is None:
                    return None
                trial[row] -= int(seq_len[group, g])
                rows_with.add(row)
            else:
                trial[row] -= shared
            out.append((int(g), row))
        free[:] = trial
        return out

    chunks: list[tuple[list[int], list]] = []  # (free tokens per row, [(p, g, row)])
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
        placed.extend((int(p), g, r) for g, r in spots)
    prompt_real = np.asarray(prompt_mask) > 0
    return [_build(placed, prompt_ids, prompt_real, plen, response_ids, rlen, rows, length, share_prompts)
            for _, placed in chunks]


def _build(placed, prompt_ids, prompt_real, plen, response_ids, rlen, rows, length, share_prompts) -> PackedChunk:
    """Lays out each row's segments in the order they were placed: the prompt's tokens but the last
    (branch 0), then per response the prompt's last token and the response (branch 1, 2, ...); one
    segment per sequence, or per (row, group) with `share_prompts`."""
    (p_count, g_count), t_max = rlen.shape, response_ids.shape[-1]
    tokens, segs, pos, targets, branches = (np.zeros((rows, length), np.int32) for _ in range(5))
    index = np.zeros((p_count, g_count, t_max), np.int32)
    valid = np.zeros((p_count, g_count, t_max), bool)
    groups = np.zeros(p_count, bool)
    segments: list[list] = [[] for _ in range(rows)]  # per row: [(p, [g, ...])] in placement order
    for p, g, r in placed:
        if share_prompts and segments[r] and segments[r][-1][0] == p:
            segments[r][-1][1].append(g)
        else:
            segments[r].append((p, [g]))
    for r, row in enumerate(segments):
        o = 0
        for seg, (p, gs) in enumerate(row, start=1):
            prompt, s_len = prompt_ids[p][prompt_real[p]], int(plen[p])
            tokens[r, o:o + s_len - 1] = prompt[:-1]  # the shared prefix, branch 0
            targets[r, o:o + s_len - 1] = prompt[1:]
            pos[r, o:o + s_len - 1] = np.arange(s_len - 1)
            segs[r, o:o + s_len - 1] = seg
            o += s_len - 1
            for branch, g in enumerate(gs, start=1):
                n = int(rlen[p, g])
                tokens[r, o:o + n + 1] = np.concatenate([prompt[-1:], response_ids[p, g, :n]])
                targets[r, o:o + n] = response_ids[p, g, :n]  # the branch's last token predicts nothing (0)
                pos[r, o:o + n + 1] = np.arange(s_len - 1, s_len + n)
                segs[r, o:o + n + 1], branches[r, o:o + n + 1] = seg, branch
                index[p, g, :n] = r * length + o + np.arange(n)
                valid[p, g, :n] = True
                o += n + 1
            groups[p] = True
    return PackedChunk(tokens, segs, pos, targets, branches, index, valid, groups)


def pack_with_tail(prompt_ids, prompt_mask, response_ids, response_mask, *, rows: int, tail_rows: int,
                   length: int, share_prompts: bool = False) -> list[PackedChunk]:
    """`pack_groups` into `rows`-row chunks, then the last chunk's groups again into chunks of a multiple
    of `tail_rows` rows below `rows`: the height that takes the fewest rows in all (the taller on a tie),
    when that is fewer than `rows` (and each of the groups fits one such chunk)."""
    batch = (prompt_ids, prompt_mask, response_ids)
    chunks = pack_groups(*batch, response_mask, rows=rows, length=length, share_prompts=share_prompts)
    heights = tail_heights(rows, tail_rows)
    if not chunks or not heights:
        return chunks
    only_last = np.asarray(response_mask) * chunks[-1].groups[:, None, None]
    best, best_rows = chunks[-1:], rows
    for height in heights[::-1]:
        try:
            tail = pack_groups(*batch, only_last, rows=height, length=length, share_prompts=share_prompts)
        except ValueError:  # a group of the last chunk does not fit `height` rows
            continue
        if len(tail) * height < best_rows:
            best, best_rows = tail, len(tail) * height
    return chunks[:-1] + best


def tail_heights(rows: int, tail_rows: int) -> list[int]:
    """The tail chunks' heights: the multiples of `tail_rows` below `rows` (none when `tail_rows` is 0)."""
    return list(range(tail_rows, rows, tail_rows)) if tail_rows > 0 else []
