"""A run's data, checked before any model loads: the train stream (one source, a mixture, or a supervised
objective's examples), the evaluation stream and the scorer, each source's answers through its own rewards.

    stream, eval_stream, scorer = make_data(cfg, tokenizer, cfg.objective_config)

Above `sources.py` (one source's stream and scorer), `mixture.py` (several sources) and `supervised.py`
(examples with their responses), which it chooses between.
"""

from __future__ import annotations

import warnings

from dapo_jax.rewards.custom import CustomReward, CustomRewardError
from dapo_jax.rewards.reward_model import LearnedReward
from dapo_jax.training.mixture import make_mixture
from dapo_jax.training.sources import DataError, RunScorer, _short, make_scorer, make_stream
from dapo_jax.training.supervised import supervised_stream


def make_data(cfg, tokenizer, objective, *, sample: int = 8):
    """`(train_stream, eval_stream | None, scorer)`, all checked before any model loads; with a supervised
    objective the train stream's examples carry their responses (training/supervised.py).

    Every configured file is opened and every row parsed (`make_stream`), the reward functions are
    built and the rule functions run once on the first `sample` problems of each source (each ground
    truth scored as a response to itself), a user function called once on the first row (likewise), and
    every ground truth read by each function that reads one (`unreadable_truths`), so a bad row, field,
    file, reward or reward option fails in seconds, naming it.
    A mixture (`data.sources`) or difficulty filtering (`data.difficulty`): a `data.mixture.MixtureStream`
    and each source's own reward functions (training/mixture.py).
    """
    max_len = cfg.data.max_prompt_length
    scorer = make_scorer(cfg.reward, objective, tokenizer=tokenizer,
                         max_length=max_len + cfg.rollout.max_new_tokens)
    if objective.supervised:  # (prompt, response) examples to fine-tune on (training/supervised.py)
        stream = supervised_stream(cfg, tokenizer)
        checks = []  # the data's responses are trained on, not scored
    elif cfg.data.sources is None and cfg.data.difficulty is None:
        stream = make_stream(cfg.data.train, tokenizer, max_prompt_length=max_len, seed=cfg.data.seed,
                             order_seed=cfg.data.order_seed)
        checks = [("data.train", stream, scorer)]
    else:
        stream, train_scorer, checks = make_mixture(cfg, tokenizer, objective, default=scorer)
    eval_stream = None
    if cfg.data.eval is not None:
        eval_stream = make_stream(cfg.data.eval, tokenizer, max_prompt_length=max_len, seed=cfg.data.seed,
                                  shuffle=False, key="data.eval")
        checks.append(("data.eval", eval_stream, scorer))
    # each source's rule functions on its first answers, its ground truths through each function that reads
    # one, and each user function once on its first row (import and signature were checked by make_scorer;
    # make_scorer has checked each reward model's folder)
    for name, s, source_scorer in checks:
        unreadable_truths(source_scorer, s, name)
        examples = s.examples[:sample]
        answers = [e.answer for e in examples]
        rules = [f for f in source_scorer.functions if not isinstance(f[1], (LearnedReward, CustomReward))]
        strict = RunScorer(rules, on_error="raise") if rules else None
        if strict is not None:
            strict.require_scored = False  # a few rows: unreadable_truths judges the whole source
        try:
            if strict is not None:
                strict(answers, answers)
        except DataError as e:
            raise DataError(f"{name}: the reward cannot score this source's answers: {e}") from e
        for j, (fn_name, fn, _) in enumerate(source_scorer.functions):
            if isinstance(fn, CustomReward) and examples:
                first = examples[0]
                try:
                    fn.dry_run(first.answer, first.answer, first.row or {}, first.text)
                except CustomRewardError as e:
                    raise DataError(f"reward.functions.{j}: {e} (on {name} row {first.index}, its ground truth "
                                    f"{_short(first.answer)} as the response)") from e
    return stream, eval_stream, (scorer if cfg.data.sources is None else train_scorer)


def unreadable_truths(scorer, stream, name: str) -> None:
    """Every ground truth of `stream` through each function that reads one: none readable is a
    `DataError` naming the function; some unreadable is a warning with their count and the first row."""
    answers = [e.answer for e in stream.examples]
    for j, (fn_name, fn, _) in enumerate(scorer.functions):
        read = getattr(fn, "truth_readable", None)
        if read is None or not answers:
            continue
        bad = [i for i, a in enumerate(answers) if not read(a)]
        if len(bad) == len(answers):
            raise DataError(f"{name}: reward.functions.{j} ({fn_name!r}) cannot read any of the {len(answers)} "
                            f"ground truths (row {stream.examples[0].index}: {_short(answers[0])}): check "
                            f"{name}.format / {name}.answer_field, or choose a reward for this data")
        if bad:
            warnings.warn(f"{name}: {len(bad)} of {len(answers)} ground truths cannot be read by reward "
                          f"{fn_name!r} (first: row {stream.examples[bad[0]].index}, {_short(answers[bad[0]])}); "
                          f"their responses are scored wrong and counted in reward_unreadable/"
                          f"{scorer.part_names[j]}", RuntimeWarning, stacklevel=2)


__all__ = ["make_data", "unreadable_truths"]
