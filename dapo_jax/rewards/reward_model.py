"""Learned reward models scored on the device, beside the rule rewards (DeepSeekMath §4.1: GRPO's
outcome and process supervision both come from reward models).

    rm = make_learned_reward("reward_model", "models/my-rm", {"batch_size": 64}, wrong=0.0, max_length=256)
    rm.load(mesh, dtype="bfloat16")                       # frozen weights, sharded by models/sharding.py
    scores, errors = rm.score_rows(prompts, responses)    # [N] float32, {row: why it could not be scored}

=========================== ==========================================================================
name                        what it reads
=========================== ==========================================================================
``reward_model``            outcome RM: a Hugging Face ``*ForSequenceClassification`` with one label;
                            the reward is its logit at the last non-pad token of (prompt, response)
                            rendered with the RM's own chat template (transformers' pooling)
``process_reward_model``    process RM: a token classifier (``*ForTokenClassification``, or the
                            Qwen2.5-Math-PRM head layout) reading the response split into steps, a
                            ``separator`` token after each; step ``j``'s reward is the probability of
                            ``positive_label`` at its separator; as an outcome reward, the ``aggregate``
                            (min by default) of the steps
=========================== ==========================================================================

Options (``reward.functions.N.options``): ``batch_size`` (rows per device call, rounded up to a
multiple of the mesh's batch shards; default 64), ``max_length`` (tokens per row; default: the run's
prompt + response budget plus the template's own tokens, rounded up to 16), ``template`` (``chat``:
the RM's chat template over [system], user = the prompt, assistant = the response; ``raw``: prompt +
response, the tokenizer's special tokens added), ``system`` (a system message), ``wrong`` (the value of
a row that cannot be scored: longer than ``max_length``, or a process RM whose separators do not
line up with its steps; default ``reward.wrong``). A process RM also takes ``separator`` (one token
of its tokenizer, default ``<extra_0>`` as Qwen2.5-Math-PRM), ``splitter`` (``lines``,
``paragraphs`` or a literal delimiter: `rewards.steps.split_steps`), ``aggregate`` (``min``,
``mean``, ``last``, ``prod``) and ``positive_label`` (default 1).

Every device call has one shape, ``[batch_size, max_length]`` (rows padded on the right, the last
call's missing rows blank), so the scoring program compiles once. Rows are tokenized together on the
host; nothing runs one response at a time. The model is frozen: it never enters an optimizer, and
its parameters are stored in the run's compute dtype.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from dapo_jax.data.templates import render_prompt
from dapo_jax.models.checks import check_finite_weights
from dapo_jax.models.classifier import Classifier, classifier_partition_spec, sequence_logits
from dapo_jax.models.config import ModelConfig
from dapo_jax.models.decoder import Decoder, positions_from_mask
from dapo_jax.models.hf_classifier_io import classifier_head_layout, load_classifier
from dapo_jax.models.hf_io import load_tokenizer
from dapo_jax.parallel.mesh import batch_divisor, batch_sharding
from dapo_jax.rewards.steps import split_steps

__all__ = ["LEARNED_REWARDS", "LearnedReward", "OutcomeRewardModel", "ProcessRewardModel", "make_learned_reward",
           "make_score_fn", "prompt_unwrapper", "render_row", "tokenize_rows"]

LEARNED_REWARDS = ("reward_model", "process_reward_model")
AGGREGATES = {"min": np.min, "mean": np.mean, "last": lambda x: x[-1], "prod": np.prod}
LENGTH_MULTIPLE = 16


@dataclasses.dataclass(frozen=True)
class Options:
    batch_size: int = 64
    max_length: int | None = None
    template: str = "chat"
    system: str | None = None
    wrong: float | None = None
    # process reward models only
    separator: str = "<extra_0>"
    splitter: str = "lines"
    aggregate: str = "min"
    positive_label: int = 1


_OUTCOME_OPTIONS = ("batch_size", "max_length", "template", "system", "wrong")


def _options(name: str, options: dict) -> Options:
    allowed = _OUTCOME_OPTIONS if name == "reward_model" else tuple(f.name for f in dataclasses.fields(Options))
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        raise TypeError(f"unknown option(s) {unknown}; allowed: {sorted(allowed)}")
    o = Options(**options)
    if not isinstance(o.batch_size, int) or o.batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {o.batch_size!r}")
    if o.max_length is not None and (not isinstance(o.max_length, int) or o.max_length < 2):
        raise ValueError(f"max_length must be an integer >= 2, got {o.max_length!r}")
    if o.template not in ("chat", "raw"):
        raise ValueError(f"template must be 'chat' or 'raw', got {o.template!r}")
    if o.aggregate not in AGGREGATES:
        raise ValueError(f"aggregate must be one of {sorted(AGGREGATES)}, got {o.aggregate!r}")
    if o.wrong is not None and not math.isfinite(float(o.wrong)):
        raise ValueError(f"wrong must be a finite number, got {o.wrong!r}")
    return o


def make_score_fn(graphdef, *, kind: str, pad_token_id: int | None, positive_label: int = 1):
    """The jitted device program `(params, ids [B, L], mask [B, L]) ->` outcome scores `[B]` (the
    sequence classifier's logit where transformers pools it) or, for a process RM, the probability of
    `positive_label` at every position `[B, L]`. float32."""
    @jax.jit
    def score(params, ids, mask):
        model = nnx.merge(graphdef, params)
        logits = model(ids, positions_from_mask(mask), mask)
        if kind == "reward_model":
            return sequence_logits(logits, ids, mask, pad_token_id=pad_token_id)[:, 0]
        return jax.nn.softmax(logits, axis=-1)[..., positive_label]

    return score


def render_row(tokenizer, prompt: str, response: str, *, template: str = "chat", system: str | None = None) -> str:
    """The text a reward model reads: its chat template over [system], user = `prompt`, assistant =
    `response` (`template="chat"`), or `prompt + response` (`"raw"`)."""
    if template == "raw":
        return prompt + response
    messages = [{"role": "system", "content": system}] if system is not None else []
    messages += [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
    return tokenizer.apply_chat_template(messages, tokenize=False)


def tokenize_rows(tokenizer, prompts, responses, *, template: str = "chat", system: str | None = None) -> list[list[int]]:
    """Token ids of every rendered row, in one tokenizer call (a chat template spells out its own special
    tokens; a raw row gets the tokenizer's)."""
    texts = [render_row(tokenizer, p, r, template=template, system=system) for p, r in zip(prompts, responses, strict=True)]
    return tokenizer(texts, add_special_tokens=template == "raw")["input_ids"]


def prompt_unwrapper(policy_tokenizer):
    """`rendered policy prompt -> its user message`: the policy's chat template stripped off (a prompt
    rendered with the `chat` / `dapo_chat` templates), so a reward model reads the question as the user
    asked it, inside its own template. Other prompts pass unchanged."""
    if policy_tokenizer is None or not getattr(policy_tokenizer, "chat_template", None):
        return lambda text: text
    mark = "\x00PROMPT\x00"
    try:
        prefix, suffix = render_prompt(mark, template="chat", tokenizer=policy_tokenizer).split(mark)
    except (ValueError, TypeError):  # a template that repeats or drops the message: leave prompts alone
        return lambda text: text
    if not prefix and not suffix:
        return lambda text: text

    def unwrap(text: str) -> str:
        if len(text) >= len(prefix) + len(suffix) and text.startswith(prefix) and text.endswith(suffix):
            return text[len(prefix):len(text) - len(suffix)]
        return text

    return unwrap


class LearnedReward:
    """A reward model folder, checked at construction (config, score head, tokenizer, template: no
    weights read), loaded onto the device by `load` (or lazily on first use, on the default device)."""

    kind = ""

    def __init__(self, name: str, path: str | Path, options: dict | None = None, *, wrong: float = 0.0,
                 max_length: int | None = None):
        self.name = name
        self.path = Path(path)
        self.options = _options(name, dict(options or {}))
        self.wrong = float(self.options.wrong if self.options.wrong is not None else wrong)
        if not (self.path / "config.json").exists():
            raise FileNotFoundError(f"no reward model at {self.path} (no config.json): point path at a Hugging Face "
                                    f"classifier folder (weights, config.json and tokenizer files together)")
        self.head, self.num_labels, self.bias = classifier_head_layout(self.path)
        self._check_head()
        hf = json.loads((self.path / "config.json").read_text())
        self.max_positions = int(hf.get("max_position_embeddings", 2048))
        self.tokenizer = load_tokenizer(self.path)
        self.pad_token_id = hf.get("pad_token_id")
        self.pad_id = next((int(i) for i in (self.pad_token_id, self.tokenizer.pad_token_id, self.tokenizer.eos_token_id)
                            if i is not None), 0)
        if self.options.template == "chat" and not getattr(self.tokenizer, "chat_template", None):
            raise ValueError(f"template='chat' but the tokenizer in {self.path} has no chat template: set "
                             f"options.template=raw")
        overhead = len(self.tokenize([""], [""])[0])
        self.max_length = self.options.max_length or min(
            self.max_positions, -(-(overhead + (max_length or self.max_positions)) // LENGTH_MULTIPLE) * LENGTH_MULTIPLE)
        self.params = None
        self._fn = None
        self._rows = self.call_rows(None)

    def _check_head(self) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ host side
    def tokenize(self, prompts, responses) -> list[list[int]]:
        return tokenize_rows(self.tokenizer, prompts, responses, template=self.options.template,
                             system=self.options.system)

    # ------------------------------------------------------------------ device side
    def load(self, mesh=None, *, dtype: str = "float32") -> "LearnedReward":
        """Reads the weights (onto `mesh` by the sharding rules, else the default device) in `dtype`."""
        model = load_classifier(self.path, mesh=mesh, dtype=dtype, param_dtype=dtype)
        check_finite_weights(model, source=str(self.path))
        graphdef, self.params = nnx.split(model, nnx.Param)
        self._fn = self._score_fn(graphdef)
        self._mesh = mesh
        self._rows = self.call_rows(mesh)
        return self

    # one device call, as the run makes it (`_run`) and the memory plan lowers it (`abstract`)
    def call_rows(self, mesh) -> int:
        """Rows of one device call: `batch_size`, rounded up to a multiple of `mesh`'s batch shards."""
        shards = batch_divisor(mesh) if mesh is not None else 1
        return -(-self.options.batch_size // shards) * shards

    def blank_call(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """One device call's host inputs, empty: ids `[rows, max_length]` int32 of the pad id, mask of zeros
        (`_run` writes the rows in; `abstract` gives their shapes)."""
        return (np.full((rows, self.max_length), self.pad_id, np.int32), np.zeros((rows, self.max_length), np.int32))

    def _score_fn(self, graphdef):
        return make_score_fn(graphdef, kind=self.name, pad_token_id=self.pad_token_id,
                             positive_label=self.options.positive_label)

    def abstract(self, mesh, *, dtype: str = "float32"):
        """What `load(mesh, dtype=dtype)` would build, without reading a weight (for a memory plan):
        `(params, (ids, mask), score_fn)`: the parameters as `jax.ShapeDtypeStruct`s with their
        `NamedSharding`s (an `nnx.State`), one device call's inputs `[rows, max_length]` int32 laid out
        over the batch shards, and the jitted program (`score_fn.lower(params, ids, mask)` compiles it)."""
        from jax.sharding import NamedSharding

        config = ModelConfig.from_pretrained(self.path, tie_word_embeddings=True, dtype=dtype, param_dtype=dtype)
        abstract = nnx.eval_shape(lambda: Classifier(Decoder(config, rngs=nnx.Rngs(0)), num_labels=self.num_labels,
                                                     head=self.head, bias=self.bias, rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract, nnx.Param)
        params = nnx.map_state(lambda path, v: v.replace(jax.ShapeDtypeStruct(
            v.get_value().shape, v.get_value().dtype, sharding=NamedSharding(mesh, classifier_partition_spec(path)))),
            state)
        x = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=batch_sharding(mesh)),
                         self.blank_call(self.call_rows(mesh)))
        return params, x, self._score_fn(graphdef)

    def _run(self, rows: list[list[int]]) -> list[np.ndarray]:
        """Device outputs for token rows (each at most `max_length`), `batch_size` rows a call."""
        if self._fn is None:
            self.load()
        b = self._rows
        out = []
        for start in range(0, len(rows), b):
            chunk = rows[start:start + b]
            ids, mask = self.blank_call(b)
            for i, row in enumerate(chunk):
                ids[i, :len(row)] = row
                mask[i, :len(row)] = 1
            mask[len(chunk):, 0] = 1  # blank rows: one real token keeps every softmax row finite
            if self._mesh is not None:
                ids, mask = jax.device_put((ids, mask), batch_sharding(self._mesh))
            out.extend(np.asarray(jax.device_get(self._fn(self.params, ids, mask)))[:len(chunk)])
        return out

    def _too_long(self, rows) -> dict[int, str]:
        return {i: f"{len(r)} tokens > max_length={self.max_length} of reward model {self.path} (raise "
                   f"reward.functions.N.options.max_length)" for i, r in enumerate(rows) if len(r) > self.max_length}


class OutcomeRewardModel(LearnedReward):
    """A sequence classifier with one label: the reward is its logit for (prompt, response)."""

    def _check_head(self) -> None:
        if self.num_labels != 1:
            raise ValueError(f"{self.path}: reward_model needs a sequence classifier with one label, its score head "
                             f"has {self.num_labels} (a token classifier is a process_reward_model)")

    def score_rows(self, prompts, responses) -> tuple[np.ndarray, dict[int, str]]:
        """`[N]` float32 scores and `{row: why}` for the rows that could not be scored (their score: `wrong`)."""
        rows = self.tokenize(prompts, responses)
        errors = self._too_long(rows)
        ok = [i for i in range(len(rows)) if i not in errors]
        scores = np.full(len(rows), self.wrong, np.float32)
        if ok:
            scores[ok] = np.asarray(self._run([rows[i] for i in ok]), np.float32)
        return scores, errors

    def is_correct(self, scores: np.ndarray) -> np.ndarray:
        return scores > 0.0  # the logit of "good": P(good) > 1/2


class ProcessRewardModel(LearnedReward):
    """A token classifier read at a separator token placed after every step of the response."""

    def _check_head(self) -> None:
        if self.num_labels < 2 or not 0 <= self.options.positive_label < self.num_labels:
            raise ValueError(f"{self.path}: process_reward_model needs a token classifier with >= 2 labels and "
                             f"positive_label in range; its score head has {self.num_labels}, positive_label="
                             f"{self.options.positive_label}")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        sep = self.tokenizer(self.options.separator, add_special_tokens=False)["input_ids"]
        if len(sep) != 1:
            raise ValueError(f"separator {self.options.separator!r} is {len(sep)} tokens in the tokenizer of "
                             f"{self.path}, not one: set options.separator to one of its tokens")
        self.separator_id = int(sep[0])
        # the last call's rows and result: a rollout's outcome part and its step rewards read the same rows
        self._memo, self._lock = None, threading.Lock()

    def step_rows(self, prompts, responses) -> tuple[list[list[tuple[float, int]]], dict[int, str]]:
        """Each response's steps `[(P(positive) at its separator, index of the step's last character)]`
        and `{row: why}` for the rows that could not be scored (no steps). The same rows twice in a row
        (the outcome reward, then the step rewards, of one rollout) run the model once."""
        key = (tuple(prompts), tuple(responses))
        with self._lock:
            if self._memo is not None and self._memo[0] == key:
                out, errors = self._memo[1]
                return [list(s) for s in out], dict(errors)
        out, errors = self._step_rows(prompts, responses)
        with self._lock:
            self._memo = (key, (out, dict(errors)))
        return [list(s) for s in out], errors

    def _step_rows(self, prompts, responses):
        steps = [split_steps(r, self.options.splitter) for r in responses]
        sep = self.options.separator
        rows = self.tokenize(prompts, ["".join(text + sep for text, _ in s) for s in steps])
        errors = self._too_long(rows)
        ok = [i for i in range(len(rows)) if i not in errors]
        probs = dict(zip(ok, self._run([rows[i] for i in ok]))) if ok else {}
        out: list[list[tuple[float, int]]] = []
        for i, (s, row) in enumerate(zip(steps, rows)):
            if i in errors:
                out.append([])
                continue
            at = np.flatnonzero(np.asarray(row) == self.separator_id)
            if len(at) < len(s):
                errors[i] = (f"{len(at)} separator tokens for {len(s)} steps: {sep!r} does not tokenize as one "
                             f"token after each step")
                out.append([])
                continue
            at = at[len(at) - len(s):]  # the last ones: the separators after the steps
            out.append([(float(probs[i][j]), end) for j, (_, end) in zip(at, s)])
        return out, errors

    def score_rows(self, prompts, responses) -> tuple[np.ndarray, dict[int, str]]:
        """`[N]` the `aggregate` of each response's step rewards (0 for a response with no step)."""
        steps, errors = self.step_rows(prompts, responses)
        agg = AGGREGATES[self.options.aggregate]
        scores = np.asarray([self.wrong if i in errors else float(agg(np.asarray([r for r, _ in s]))) if s else 0.0
                             for i, s in enumerate(steps)], np.float32)
        return scores.reshape(len(steps)), errors

    def is_correct(self, scores: np.ndarray) -> np.ndarray:
        return scores > 0.5


def make_learned_reward(name: str, path: str | Path, options: dict | None = None, **kwargs) -> LearnedReward:
    """The learned reward `name` (`LEARNED_REWARDS`) of the folder `path`, checked (not yet loaded)."""
    if name == "reward_model":
        return OutcomeRewardModel(name, path, options, **kwargs)
    if name == "process_reward_model":
        return ProcessRewardModel(name, path, options, **kwargs)
    raise KeyError(f"unknown learned reward {name!r}; known: {LEARNED_REWARDS}")
