"""Data: datasets mapped to (problem, answer), prompt templates, a resumable prompt stream, the synthetic task.

    problems = load_problems(path_or_name, format="gsm8k")            # datasets.py
    stream = PromptStream(problems, tokenizer, template="dapo", max_prompt_length=512, seed=0)
    batch = stream.next_batch(32)                                     # left-padded [32, bucket] + answers
"""

from dapo_jax.data.batching import bucket_length, default_buckets, left_pad
from dapo_jax.data.datasets import FORMATS, DataError, DatasetFormat, Problem, load_problems, register_format, to_problems
from dapo_jax.data.stream import PromptBatch, PromptExample, PromptStream, tokenize_problems
from dapo_jax.data.templates import DAPO_TEMPLATE, TEMPLATES, render_prompt

__all__ = [
    "DAPO_TEMPLATE", "FORMATS", "TEMPLATES", "DataError", "DatasetFormat", "Problem", "PromptBatch",
    "PromptExample", "PromptStream", "bucket_length", "default_buckets", "left_pad", "load_problems",
    "register_format", "render_prompt", "to_problems", "tokenize_problems",
]
