"""Workloads: what a request asks for (`Ask`), the seeded mix of chat requests the goodput benchmark and the burst
send, and `PromptMaker`, which writes a chat prompt of a given length.

The mix: 70% short prompts (40-150 tokens) with short outputs (16-64), 30% long (300-430) with long ones (128-256),
half streaming; the same seed gives every system the same requests. A prompt opens with its request's number
("Request N.") so no two share a prefix beyond the chat template; its length is calibrated once, against the
service's /tokenize or the model's own tokenizer and chat template.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator
from dataclasses import dataclass

import httpx

LONG_SHARE = 0.3
SHORT_PROMPT, LONG_PROMPT = (40, 150), (300, 430)
SHORT_OUTPUT, LONG_OUTPUT = (16, 64), (128, 256)
STREAM_SHARE = 0.5
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue side "
         "kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face level office door health person art "
         "war history party result change morning reason research girl moment air teacher force education river "
         "garden window table paper music market train").split()


@dataclass(frozen=True)
class Ask:
    """One request of a mix. `index` is unique within a run (it opens the prompt's text)."""

    index: int
    prompt_tokens: int  # target length of the rendered chat prompt
    max_tokens: int  # exact output length (ignore_eos), unless the client hangs up
    stream: bool
    hangup: bool = False  # the client goes away early
    hangup_chunks: int = 0  # streaming: after this many content chunks
    hangup_after_s: float = 0.0  # non-streaming: client timeout


def stream(seed: int, first_index: int = 0) -> Iterator[Ask]:
    """The mix without end."""
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


class PromptMaker:
    """Chat prompts of about N tokens: `calibrate` against the service's own /tokenize, or `for_model`."""

    def __init__(self, base_tokens: float = 30.0, tokens_per_word: float = 1.0):
        self.base = base_tokens
        self.per_word = tokens_per_word

    @staticmethod
    def text(index: int, words: int) -> str:
        r = random.Random(index)
        return f"Request {index}. Continue this list: " + " ".join(r.choice(WORDS) for _ in range(max(1, words)))

    async def calibrate(self, http: httpx.AsyncClient, model: str) -> None:
        async def count(words: int) -> int:
            r = await http.post("/tokenize", json={"model": model,
                                                   "messages": [{"role": "user", "content": self.text(0, words)}]})
            r.raise_for_status()
            return r.json()["count"]

        self.fit(await count(10), await count(410))

    def messages(self, ask: Ask) -> list[dict[str, str]]:
        words = round((ask.prompt_tokens - self.base) / self.per_word)
        return [{"role": "user", "content": self.text(ask.index, words)}]

    def fit(self, small: int, large: int) -> None:
        """Calibrated from the token counts of the 10- and the 410-word prompt."""
        self.per_word = (large - small) / 400
        self.base = small - 10 * self.per_word

    @classmethod
    def for_model(cls, model_dir: str | None) -> PromptMaker:
        """Calibrated with the model's own tokenizer and chat template (its default guess, 30 tokens of template
        and one token a word, when the tokenizer cannot be loaded)."""
        maker = cls()
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
        if large > small:
            maker.fit(small, large)
        return maker
