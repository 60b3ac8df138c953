"""The routing benchmark's four workloads (issue 24), new prompts every round (a prefix cache flatters a reused set):

- W1 shared system prompts: vLLM's own prefix-repetition generator (`vllm bench serve --dataset-name
  prefix_repetition`, the workload of Ray's published prefix-routing result): 1,024-token prefixes, 64-token
  suffixes, 32 output tokens, as many prefixes as fit both replicas' caches together but not one's;
- W2 multi-turn chat: 12 sessions at once, each adding a turn to a growing history (a 512-token system prompt, then
  128-token user turns, the model's own answers kept; up to ~1,500 tokens) with think time between turns, the session
  named in `X-Session-Id`: their histories together fit two replicas' caches, not one's;
- W3 control: unrelated prompts (every prefix used once);
- W4 hotspot: one prefix carries 70 % of the requests.

Prompts are text decoded from random token ids as vLLM's generator makes them (`gen_prompt_decode_to_target_len`
keeps each at its token length), with the model's own tokenizer.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

WORKLOADS = ("W1", "W2", "W3", "W4")
TITLES = {"W1": "shared system prompts (vLLM prefix_repetition)", "W2": "multi-turn chat",
          "W3": "control: unrelated prompts", "W4": "hotspot: one prefix 70 %"}
OUTPUT_TOKENS = 32


@dataclass(frozen=True)
class Shape:
    """How big each workload is; the defaults fit a round of all four in a few minutes on two cores."""

    prefix_tokens: int = 1024
    suffix_tokens: int = 64
    prefixes: int = 16  # W1: 16 x 8 blocks of 128 fit two caches of 91 blocks together, not one (run.cache_gib)
    per_prefix: int = 4
    sessions: int = 12
    turns: int = 6
    system_tokens: int = 512
    turn_tokens: int = 128
    control_prompts: int = 48
    control_tokens: int = 512
    hot_requests: int = 42
    cold_requests: int = 18


@dataclass
class Request:
    """One completion (`prompt`) or one chat session (`turns`: the user messages in order)."""

    prompt: str = ""
    system: str = ""
    turns: list[str] = field(default_factory=list)
    session: str = ""

    @property
    def is_session(self) -> bool:
        return bool(self.turns)


def _texts(tokenizer: Any, lengths: list[int], seed: int) -> list[str]:
    """Random texts of exactly these token lengths, vLLM's way."""
    import numpy as np
    from vllm.benchmarks.datasets.datasets import gen_prompt_decode_to_target_len

    rng = np.random.default_rng(seed)
    out = []
    for length in lengths:
        ids = rng.integers(0, tokenizer.vocab_size, size=length).tolist()
        text, _, _ = gen_prompt_decode_to_target_len(tokenizer=tokenizer, token_sequence=ids,
                                                     target_token_len=length, add_special_tokens=False)
        out.append(text)
    return out


def _prefix_repetition(tokenizer: Any, shape: Shape, seed: int, prefixes: int, per_prefix: int) -> list[Request]:
    from vllm.benchmarks.datasets.datasets import PrefixRepetitionRandomDataset

    dataset = PrefixRepetitionRandomDataset(random_seed=seed)
    samples = dataset.sample(tokenizer=tokenizer, num_requests=prefixes * per_prefix, prefix_len=shape.prefix_tokens,
                             suffix_len=shape.suffix_tokens, num_prefixes=prefixes, output_len=OUTPUT_TOKENS)
    return [Request(prompt=str(s.prompt)) for s in samples]


def build(workload: str, tokenizer: Any, shape: Shape, seed: int) -> list[Request]:
    """The requests of `workload` for the round seeded `seed`."""
    if workload == "W1":
        return _prefix_repetition(tokenizer, shape, seed, shape.prefixes, shape.per_prefix)
    if workload == "W2":
        systems = _texts(tokenizer, [shape.system_tokens] * shape.sessions, seed)
        turns = _texts(tokenizer, [shape.turn_tokens] * (shape.sessions * shape.turns), seed + 1)
        return [Request(system=systems[s], turns=turns[s * shape.turns:(s + 1) * shape.turns],
                        session=f"r{seed}-s{s}") for s in range(shape.sessions)]
    if workload == "W3":
        return [Request(prompt=p) for p in _texts(tokenizer, [shape.control_tokens] * shape.control_prompts, seed)]
    if workload == "W4":
        hot = _prefix_repetition(tokenizer, shape, seed, 1, shape.hot_requests)
        cold = _prefix_repetition(tokenizer, shape, seed + 1, 6, shape.cold_requests // 6)
        mixed = hot + cold
        random.Random(seed).shuffle(mixed)
        return mixed
    raise ValueError(f"no workload {workload!r}; choose from {WORKLOADS}")
