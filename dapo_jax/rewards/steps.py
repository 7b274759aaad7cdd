"""Step rewards for process supervision (docs/objectives.md#process-supervision): one reward per step,
with where it ends.

A step reward function is called as ``fn(response, prompt, answer) -> [(reward, char_end), ...]``:
one entry per step of the response, ``char_end`` the index in ``response`` of the step's last
character. Steps are lines here ("one step per line", DeepSeekMath's process supervision):

=============== ====================================================================================
name            steps
=============== ====================================================================================
``cot``         the chain-of-thought task (``dapo_jax.data.cot``): every non-blank line. A running-sum
                line ``...+c4=16`` is +1 when its sum equals the true sum of the prompt's terms up to
                the last label it names (``c``), a ``Total: N`` line when N equals the last such sum,
                the ``Answer: N`` line when N is the answer; anything else, and every wrong sum, -1.
                A response that stops early ends on one more -1 step for each line the solution still
                needed (each running sum up to the last label, and the ``Answer:`` line), placed on
                the STOP: the token that ended the response (its EOS; the last token when it was cut
                off). The decision to stop after an incomplete chain is then scored like the lines it
                skipped; placed on the last character instead, the stop token would lie after every
                step and always get advantage 0, while going on gets a negative sum.
``synthetic``   the embedded task: every non-blank line, +1 when it is the answer's integer, else -1
                (its responses are one line: one step, the outcome reward)
=============== ====================================================================================

A line's running sum is judged against the truth, not against the line before it: after a slip,
every later line is wrong too (the chain carries the error to the answer).

:func:`make_step_scorer` turns the character ends into token indices (each token decoded alone,
pieces concatenated: exact for character-level and byte-level BPE tokenizers as long as no character
is split across two tokens) and pads the steps to fixed-shape ``[P, G, J]`` arrays, ``J`` = the
response length ``T`` (a step is at least one token, so ``T`` slots always suffice when no two
steps end in one token; surplus steps would be dropped).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np

from dapo_jax.data import cot, synthetic

__all__ = ["STEP_REWARDS", "cot_steps", "synthetic_steps", "split_steps", "step_arrays", "steps_to_arrays",
           "token_pieces", "make_step_scorer"]

Steps = list[tuple[float, int]]
_COT_PROMPT = re.compile(r"[a-z]\d+(?:\+[a-z]\d+)+=")
_SUM_LINE = re.compile(r"(?P<lhs>[^=]*)=[ \t]*(?P<total>-?\d+)")
_LABEL = re.compile(r"(?<![a-z])(?P<label>[a-z])\d+")
_TOTAL_LINE = re.compile(r"Total:[ \t]*(-?\d+)")
_ANSWER_LINE = re.compile(r"Answer:[ \t]*(-?\d+)")


def _lines(response: str):
    """(stripped text, index of its last character) of every non-blank line."""
    start = 0
    for line in response.split("\n"):
        stripped = line.rstrip()
        if stripped.strip():
            yield stripped.strip(), start + len(stripped) - 1
        start += len(line) + 1


def split_steps(response: str, splitter: str = "lines") -> list[tuple[str, int]]:
    """(text, index of its last character) of each step of `response`: `lines` = every non-blank line,
    `paragraphs` = every block between blank lines, any other string = the pieces between occurrences of
    that literal delimiter. Blank pieces are not steps; a step's text is stripped of surrounding white space."""
    if not splitter:
        raise ValueError("a step delimiter must not be empty")
    pattern = {"lines": r"\n", "paragraphs": r"\n[ \t]*\n"}.get(splitter, re.escape(splitter))
    steps, start = [], 0
    for m in [*re.finditer(pattern, response), None]:
        end = len(response) if m is None else m.start()
        chunk = response[start:end]
        if chunk.strip():
            text = chunk.strip()
            steps.append((text, start + len(chunk) - len(chunk.lstrip()) + len(text) - 1))
        start = end if m is None else m.end()
    return steps


def cot_steps(response: str, prompt: str, answer: str | int) -> Steps:
    """Step rewards of a chain-of-thought response (see the module table)."""
    found = _COT_PROMPT.findall(prompt)
    if not found:
        raise ValueError(f"no cot problem (like 'a5+b7=') in the prompt {prompt!r}")
    terms = cot.parse_prompt(found[-1])
    prefix = np.cumsum(terms).tolist()  # prefix[k] = the true running sum through label LABELS[k]
    steps: Steps = []
    last_sum = None  # the true sum of the last running-sum line
    reached, answered = 0, False  # the furthest label a running-sum line named (a sum line covers b on)
    for text, end in _lines(response):
        ok = False
        if m := _ANSWER_LINE.fullmatch(text):
            ok, answered = int(m.group(1)) == int(answer), True
        elif m := _TOTAL_LINE.fullmatch(text):
            ok = last_sum is not None and int(m.group(1)) == last_sum
        elif (m := _SUM_LINE.fullmatch(text)) and (labels := _LABEL.findall(m.group("lhs"))):
            k = cot.LABELS.index(labels[-1])
            last_sum = None  # a label past the last term: wrong, and no progress
            if k < len(terms):
                reached, last_sum = max(reached, k), prefix[k]
            ok = last_sum is not None and int(m.group("total")) == last_sum
        steps.append((1.0 if ok else -1.0, end))
    # the steps the solution still needed are wrong steps at the response's end: in the sum of step
    # rewards, stopping is never better than writing them wrong
    missing = (len(terms) - 1 - reached) + (not answered)
    return steps + [(-1.0, len(response))] * missing  # past the text: on the stop token


def synthetic_steps(response: str, prompt: str, answer: str | int) -> Steps:
    """Every non-blank line is a step: +1 when it is exactly the answer's integer, else -1."""
    del prompt
    return [(1.0 if synthetic.is_correct(text, str(answer)) else -1.0, end) for text, end in _lines(response)]


STEP_REWARDS: dict[str, Callable[[str, str, str], Steps]] = {"cot": cot_steps, "synthetic": synthetic_steps}


def steps_to_arrays(steps: Sequence[Steps], pieces: Sequence[Sequence[str]], *, max_steps: int,
                    lengths: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Steps `[(reward, char_end), ...]` of N responses, given as their tokens' text pieces, padded to
    `max_steps`: (rewards [N, J] float32, ends [N, J] int32 token indices, mask [N, J] float32).
    The token of character `c` is the first token whose pieces reach past `c`; a `char_end` at or past
    the end of the text is the stop token, the row's last real token (`lengths`: real tokens per row,
    EOS included; without them, the row's last piece)."""
    n = len(pieces)
    rewards = np.zeros((n, max_steps), np.float32)
    ends = np.zeros((n, max_steps), np.int32)
    mask = np.zeros((n, max_steps), np.float32)
    for i, (toks, row) in enumerate(zip(pieces, steps, strict=True)):
        reach = np.cumsum([len(p) for p in toks])
        text_length = int(reach[-1]) if len(reach) else 0
        stop = max((int(lengths[i]) if lengths is not None else len(toks)) - 1, 0)
        for j, (reward, char_end) in enumerate(row[:max_steps]):
            rewards[i, j] = reward
            ends[i, j] = stop if char_end >= text_length else np.searchsorted(reach, char_end, side="right")
            mask[i, j] = 1.0
    return rewards, ends, mask


def step_arrays(fn, pieces: Sequence[Sequence[str]], prompts: Sequence[str], answers: Sequence[str], *,
                max_steps: int, lengths: Sequence[int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Step rewards `fn(text, prompt, answer)` of N responses given as their tokens' text pieces (`steps_to_arrays`)."""
    steps = [fn("".join(toks), prompt, answer) for toks, prompt, answer in zip(pieces, prompts, answers, strict=True)]
    return steps_to_arrays(steps, pieces, max_steps=max_steps, lengths=lengths)


def token_pieces(tokenizer, response_ids, response_mask) -> list[list[str]]:
    """`[N, T]` ids -> each row's real tokens decoded one by one (each distinct id once), "" on padding."""
    ids = np.asarray(response_ids)
    vocab = np.unique(ids)
    text = dict(zip(vocab.tolist(), tokenizer.batch_decode([[int(x)] for x in vocab], skip_special_tokens=True)))
    keep = np.asarray(response_mask) > 0
    return [[text[x] if k else "" for x, k in zip(row, kept)] for row, kept in zip(ids.tolist(), keep.tolist())]


def make_step_scorer(name: str, tokenizer):
    """`(response_ids [P, G, T], response_mask [P, G, T], prompts [P], answers [P]) -> dict` of the
    `Groups` step fields `step_rewards`, `step_ends`, `step_mask`, each [P, G, T]."""
    if name not in STEP_REWARDS:
        raise KeyError(f"reward {name!r} has no step rewards; step rewards exist for {sorted(STEP_REWARDS)}")
    fn = STEP_REWARDS[name]

    def score(response_ids, response_mask, prompts, answers) -> dict[str, np.ndarray]:
        p, g, t = np.shape(response_ids)
        pieces = token_pieces(tokenizer, np.reshape(response_ids, (p * g, t)), np.reshape(response_mask, (p * g, t)))
        rep = lambda xs: [x for x in xs for _ in range(g)]  # noqa: E731
        lengths = np.reshape(np.asarray(response_mask) > 0, (p * g, t)).sum(-1)
        rewards, ends, mask = step_arrays(fn, pieces, rep(prompts), rep(answers), max_steps=t, lengths=lengths)
        return step_fields(rewards, ends, mask, (p, g, t))

    return score


def step_fields(rewards, ends, mask, shape) -> dict[str, np.ndarray]:
    """The `Groups` step fields from `[P·G, J]` arrays."""
    return {"step_rewards": rewards.reshape(shape), "step_ends": ends.reshape(shape), "step_mask": mask.reshape(shape)}
