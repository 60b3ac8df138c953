"""The request mix: the same sequence of requests for the same seed, and chat prompts of a given length.

Phases b and c restart the mix with the same seed, so both draw the same sequence of requests and their
throughputs can be compared.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import httpx

SEED = 20240611
WORDS = ("time year people way day man thing woman life child world school state family student group country "
         "problem hand part place case week company system program question work government number night point "
         "home water room mother area money story fact month lot right study book eye job word business issue side "
         "kind head house service friend father power hour game line end member law car city community name "
         "president team minute idea kid body information back parent face level office door health person art "
         "war history party result change morning reason research girl moment air teacher force education river "
         "garden window table paper music market train").split()


@dataclass(frozen=True)
class Spec:
    index: int
    prompt_tokens: int  # target length of the rendered chat prompt
    max_tokens: int  # exact output length (ignore_eos), unless the client hangs up
    stream: bool
    hangup: bool  # the client goes away early
    hangup_chunks: int  # streaming: after this many content chunks
    hangup_after_s: float  # non-streaming: client timeout


class Mix:
    """70% short, 30% long; half streaming; ~15% hang up."""

    def __init__(self, seed: int = SEED):
        self._rng = random.Random(seed)
        self._next = 0

    def next(self) -> Spec:
        r = self._rng
        long = r.random() < 0.30
        prompt = r.randint(300, 600) if long else r.randint(20, 150)
        out = r.randint(128, 256) if long else r.randint(16, 64)
        spec = Spec(index=self._next, prompt_tokens=prompt, max_tokens=out, stream=r.random() < 0.5,
                    hangup=r.random() < 0.15, hangup_chunks=r.randint(2, 5), hangup_after_s=r.uniform(1.0, 3.0))
        self._next += 1
        return spec


class PromptMaker:
    """Chat prompts of about N tokens, calibrated once against the service's own /tokenize."""

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

        small, large = await count(10), await count(410)
        self.per_word = (large - small) / 400
        self.base = small - 10 * self.per_word

    def messages(self, spec: Spec) -> list[dict[str, str]]:
        words = round((spec.prompt_tokens - self.base) / self.per_word)
        return [{"role": "user", "content": self.text(spec.index, words)}]
