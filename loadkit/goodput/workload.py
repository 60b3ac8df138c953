"""The workload mix: chat requests with short and long prompts (about 40-430 tokens) and outputs (16-256 tokens),
streaming and not, drawn from a seeded generator: the same seed gives every system the same requests.

Prompt text comes from the overload driver's `PromptMaker` (a word list, "Request N." first so no two requests
share a prefix beyond the chat template), calibrated once against the model's own tokenizer and chat template.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

from loadkit.overload.mix import PromptMaker

LONG_SHARE = 0.3
SHORT_PROMPT, LONG_PROMPT = (40, 150), (300, 430)
SHORT_OUTPUT, LONG_OUTPUT = (16, 64), (128, 256)
STREAM_SHARE = 0.5


@dataclass(frozen=True)
class Ask:
    """One request of the mix. `index` is unique within a run (it opens the prompt's text)."""

    index: int
    prompt_tokens: int  # target length of the rendered chat prompt
    max_tokens: int  # exact output length (ignore_eos)
    stream: bool


def stream(seed: int, first_index: int = 0) -> Iterator[Ask]:
    """The mix without end: 70% short prompts with short outputs, 30% long with long ones; half streaming."""
    r = random.Random(seed)
    for index in itertools.count(first_index):
        long = r.random() < LONG_SHARE
        prompt = r.randint(*(LONG_PROMPT if long else SHORT_PROMPT))
        tokens = r.randint(*(LONG_OUTPUT if long else SHORT_OUTPUT))
        yield Ask(index=index, prompt_tokens=prompt, max_tokens=tokens, stream=r.random() < STREAM_SHARE)


def mix(seed: int, count: int, first_index: int = 0) -> list[Ask]:
    """The first `count` requests of the seed's mix."""
    return list(itertools.islice(stream(seed, first_index), count))


def mean_output_tokens(asks: list[Ask]) -> float:
    return sum(a.max_tokens for a in asks) / len(asks) if asks else 0.0


def prompt_maker(model_dir: str | None) -> PromptMaker:
    """A PromptMaker whose word count gives the asked prompt length under the model's chat template (its default
    guess, 30 tokens of template and one token a word, when the tokenizer cannot be loaded)."""
    maker = PromptMaker()
    if not model_dir:
        return maker
    try:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)

        def count(words: int) -> int:
            messages = [{"role": "user", "content": maker.text(0, words)}]
            text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            return len(tok(text, add_special_tokens=False)["input_ids"])

        small, large = count(10), count(410)
    except Exception:  # the tokenizer is a refinement, never a reason not to run
        return maker
    if large <= small:
        return maker
    maker.per_word = (large - small) / 400
    maker.base = small - 10 * maker.per_word
    return maker
