"""The workload `benchmarks.peers` gives every framework: sizes, prompts, reward, the figures' format.

Pure Python + numpy (no dapo_jax, jax or torch import), so each peer's runner
(`benchmarks.peers_trl`, `benchmarks.peers_tunix`), which may run under another interpreter, reads the
very same definition. A runner prints its figures as the harness's result line (`harness.emit`).
"""

from __future__ import annotations

import dataclasses
import json

from benchmarks.harness import emit, median, parse_result  # noqa: F401  (the runners' one import)

# Qwen2-shaped models over the 98-token character vocabulary (dapo_jax/data/char_tokenizer.py), untied
# embeddings (the length control below needs a separate lm_head). Parameter counts include both
# embedding matrices.
SIZES = {
    # name: hidden, layers, heads, kv_heads, head_dim, intermediate
    "0.6m": dict(hidden_size=128, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                 intermediate_size=384),
    "5m": dict(hidden_size=256, num_hidden_layers=6, num_attention_heads=8, num_key_value_heads=4, head_dim=32,
               intermediate_size=768),
    "15m": dict(hidden_size=384, num_hidden_layers=9, num_attention_heads=6, num_key_value_heads=2, head_dim=64,
                intermediate_size=1152),
    # beyond the three above (`--sizes 2m,10m`): shapes the fast paths' defaults were not tuned on
    "2m": dict(hidden_size=192, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=2, head_dim=32,
               intermediate_size=576),
    "10m": dict(hidden_size=320, num_hidden_layers=8, num_attention_heads=10, num_key_value_heads=2, head_dim=32,
                intermediate_size=960),
}
LENGTH_DIM = 0  # the residual dimension that carries the constant EOS signal (see peers.build_model)
PROMPT_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


@dataclasses.dataclass(frozen=True)
class Workload:
    """One step = `prompts` prompts x `G` responses, one optimizer update (num_iterations = 1)."""

    prompts: int = 8
    G: int = 8
    max_prompt_length: int = 16  # prompts are 8..16 characters (= tokens), left-padded to this
    max_new_tokens: int = 64
    mean_length: float = 24.0  # target mean response length (tokens, EOS included): <= max_new_tokens / 2
    lr: float = 1e-5
    eps_low: float = 0.2
    eps_high: float = 0.28
    temperature: float = 1.0
    warmup_steps: int = 2  # excluded from the timings (compilation, caches)
    timed_steps: int = 3
    seed: int = 0

    @property
    def steps(self) -> int:
        return self.warmup_steps + self.timed_steps

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> "Workload":
        return cls(**json.loads(text))


QUICK = Workload(prompts=4, G=4, max_prompt_length=8, max_new_tokens=16, mean_length=6.0, warmup_steps=1,
                 timed_steps=2)


def prompt_texts(w: Workload) -> list[str]:
    """`w.prompts * w.steps` prompt strings (step k uses rows k*P .. k*P+P-1), the same for everyone."""
    import numpy as np

    rng = np.random.default_rng(w.seed)
    out = []
    for _ in range(w.prompts * w.steps):
        n = int(rng.integers(w.max_prompt_length // 2, w.max_prompt_length + 1))
        out.append("".join(PROMPT_ALPHABET[i] for i in rng.integers(0, len(PROMPT_ALPHABET), size=n)))
    return out


def reward(completion: str) -> float:
    """The rule reward every framework scores its decoded completions with: +1 when the completion's
    length (characters) is a multiple of 3, else -1. Cheap, and it varies within a group."""
    return 1.0 if len(completion) % 3 == 0 else -1.0


def peer_args(argv=None):
    """`(args, workload)` from a peer runner's command line: --model-dir, --workload (JSON), --size."""
    import argparse

    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", required=True)
    ap.add_argument("--workload", required=True)
    ap.add_argument("--size", default="")
    args = ap.parse_args(argv)
    return args, Workload.from_json(args.workload)


def summarize(step_s, generate_s, update_s, lengths_per_step, *, warmup: int, host_s=None) -> dict:
    """Medians over the timed steps (after `warmup`); host = step - generate - update unless given."""
    t = slice(warmup, None)
    step, gen, upd = step_s[t], generate_s[t], update_s[t]
    host = host_s[t] if host_s is not None else [s - g - u for s, g, u in zip(step, gen, upd)]
    lengths = [x for per in lengths_per_step[t] for x in per]
    return {
        "step_s": median(step), "generate_s": median(gen), "update_s": median(upd),
        "host_s": median(host),
        "step_s_all": [round(x, 4) for x in step_s],
        "mean_length": float(sum(lengths) / max(len(lengths), 1)),
        "max_length": int(max(lengths, default=0)), "min_length": int(min(lengths, default=0)),
        "num_responses": len(lengths),
    }
