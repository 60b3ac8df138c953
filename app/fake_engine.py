"""A deterministic engine behind the `Engine` interface, for fast tests.

One token is one byte of UTF-8 for prompts; the output is a fixed sentence of
word tokens (then end-of-sequence), or numbered words when `ignore_eos` is set.
`token_delay_s` makes generation take time, so admission and cancellation can be
tested; `kill()` makes it behave like a dead engine.
"""

from __future__ import annotations

import asyncio
from typing import AsyncIterator

from app.engine import ChoiceDelta, EngineDead, EngineRejected, EngineStats, GenerationDelta, GenerationParams, TokenLogprob

ANSWER = "This is a fake answer from the test engine."


class FakeEngine:
    def __init__(self, max_model_len: int = 2048, kv_cache_tokens: int = 100_000, token_delay_s: float = 0.0):
        self.max_model_len = max_model_len
        self._kv_cache_tokens = kv_cache_tokens
        self.token_delay_s = token_delay_s
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.started = False
        self.dead = False
        self._generated = 0
        self._prompted = 0

    def start(self) -> None:
        self.started = True

    @property
    def kv_cache_tokens(self) -> int:
        return self._kv_cache_tokens

    def render_chat(self, messages: list[dict[str, str]]) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}\n" for m in messages) + "<|assistant|>"
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", errors="replace"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t % 256 for t in token_ids).decode("utf-8", errors="replace")

    def _words(self, params: GenerationParams, index: int) -> list[str]:
        if params.json_schema is not None or params.json_object:
            return ['{"fake": ', "true}"]
        if params.ignore_eos:
            offset = (params.seed or 0) + index * 1000 if params.temperature > 0 else 0
            return [f"w{offset + i} " for i in range(params.max_tokens)]
        words = ANSWER.split(" ")
        if params.temperature > 0 and (params.seed is not None or index):
            words = [f"{w}{(params.seed or 0) + index}" for w in words]
        return [w + " " for w in words[:-1]] + [words[-1]]

    async def generate(self, request_id: str, prompt_token_ids: list[int], params: GenerationParams) -> AsyncIterator[GenerationDelta]:
        if self.dead:
            raise EngineDead("fake engine is dead")
        if params.json_schema is not None:
            try:
                import jsonschema

                jsonschema.Draft202012Validator.check_schema(params.json_schema)
            except Exception as err:
                raise EngineRejected(f"invalid JSON schema: {err}") from None
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise EngineRejected("prompt plus max_tokens exceeds max_model_len")
        self.running.add(request_id)
        self._prompted += len(prompt_token_ids)
        try:
            plans = [self._words(params, i) for i in range(params.n)]
            texts = ["" for _ in plans]
            done = [False for _ in plans]
            step = 0
            while not all(done):
                if self.token_delay_s:
                    await asyncio.sleep(self.token_delay_s)
                else:
                    await asyncio.sleep(0)
                if self.dead:
                    raise EngineDead("fake engine died mid-request")
                choices = []
                for i, words in enumerate(plans):
                    if done[i]:
                        continue
                    word = words[step] if step < len(words) else ""
                    texts[i] += word
                    finish = None
                    stop_at = min((texts[i].find(s) for s in params.stop if s in texts[i]), default=-1)
                    if stop_at >= 0:
                        word = word[: len(word) - (len(texts[i]) - stop_at)] if len(texts[i]) - len(word) <= stop_at else ""
                        finish = "stop"
                    elif step + 1 >= params.max_tokens:
                        finish = "length"
                    elif step + 1 >= len(words):
                        finish = "stop"
                    logprobs = None
                    if params.logprobs is not None:
                        top = tuple((f"alt{k}", -1.0 - k) for k in range(params.logprobs))
                        logprobs = (TokenLogprob(token=word, logprob=-0.5, top=((word, -0.5),) + top[: max(0, params.logprobs - 1)] if params.logprobs else ()),)
                    choices.append(ChoiceDelta(index=i, text=word, num_tokens=1, finish_reason=finish, logprobs=logprobs))
                    self._generated += 1
                    done[i] = finish is not None
                step += 1
                yield GenerationDelta(choices=tuple(choices))
        finally:
            self.running.discard(request_id)

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.running.discard(request_id)

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDead("fake engine is dead")

    def stats(self) -> EngineStats:
        return EngineStats(running=len(self.running), prompt_tokens_total=self._prompted, generation_tokens_total=self._generated)

    def kill(self) -> None:
        self.dead = True

    def shutdown(self) -> None:
        self.started = False

