"""A deterministic engine behind the `Engine` interface, for fast tests.

One token is one byte of UTF-8 for prompts (a vocabulary of 256 ids, which token ids in
`logit_bias`, `allowed_token_ids` and `stop_token_ids` must be within, as vLLM checks them);
the output is a fixed sentence of word tokens (then end-of-sequence), numbered words when
`ignore_eos` is set, and numbered words after the sentence until `min_tokens`; the token id of step s is
s % 256, and a prompt that ends with the ids of steps 0..k-1 continues at step k, as a model continues its
own answer. Stop strings are vLLM's (app/engine/stop_strings.py: the text held back while it may be the
start of one); vLLM's other sampling extensions are accepted and have no effect.
Embeddings (`embed`): a vector of `EMBEDDING_SIZE` values computed from the token ids (each id at its position),
L2-normalized as vLLM's pooler normalizes, every value a float32 (so base64's float32 round-trips exactly);
`matryoshka` says whether `dimensions` may shorten it (and to which sizes).
`token_delay_s` makes generation take time, so admission and cancellation can be
tested; `kill()` makes it behave like a dead engine.

A cost model for routing and scaling tests: a prefix cache of whole `block_tokens`-token blocks as vLLM's
(at most `kv_cache_tokens` of them, least recently used evicted; `usage.prompt_tokens_details.cached_tokens`),
prefill that takes `prefill_s_per_token` per uncached prompt token, one prompt at a time (an engine prefills in
turn, so prompts queue behind each other), and decode steps of `token_delay_s` plus `decode_s_per_batch` per
request running.

Tests wait for what the engine does, never for a fixed time: `await engine.wait_started()`,
`await engine.wait_running(n)` (n requests inside `generate` at once) and
`await engine.wait_aborted(request_id)` (or a count) return as soon as that is true and raise
`TimeoutError` if it is not within `timeout_s`. They work from any event loop or thread (the engine
may be driven by another thread's loop, or started in a background thread).
"""

from __future__ import annotations

import asyncio
import math
import threading
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

from app.engine.engine_stats import EngineStats
from app.engine.fake_model import (
    EMBEDDING_SIZE,
    VOCAB_SIZE,
    answer_words,
    auto_call,
    calls_text,
    check_params,
    check_schema,
    float32,
    prompt_logprobs,
    token_logprobs,
)
from app.engine.fake_waits import EngineWaits
from app.engine.interface import (
    ChoiceDelta,
    EmbeddingFacts,
    EngineDead,
    EngineRejected,
    GenerationDelta,
    GenerationParams,
    ToolCallDelta,
)
from app.engine.prefix_blocks import BlockLRU, block_hashes, cacheable_blocks
from app.engine.stop_strings import StopStrings

CACHE_BLOCK_TOKENS = 16  # vLLM's default block size (its CPU backend's is 128): its prefix cache hits whole blocks


def _steps_done(prompt_ids: list[int]) -> int:
    """k when the prompt ends with the ids of this engine's steps 0..k-1 after a prompt of its own (a
    continuation), else 0: a text prompt never holds byte 0."""
    if not prompt_ids:
        return 0
    k, found = prompt_ids[-1] + 1, 0
    while k < len(prompt_ids):  # the longest: past VOCAB_SIZE steps a shorter run of ids matches too
        if prompt_ids[-k:] == [j % VOCAB_SIZE for j in range(k)]:
            found = k
        k += VOCAB_SIZE
    return found


class FakeEngine(EngineWaits):
    def __init__(self, max_model_len: int = 2048, kv_cache_tokens: int = 100_000, token_delay_s: float = 0.0,
                 matryoshka: bool | tuple[int, ...] = False, block_tokens: int = CACHE_BLOCK_TOKENS,
                 prefill_s_per_token: float = 0.0, decode_s_per_batch: float = 0.0):
        super().__init__()
        self.max_model_len = max_model_len
        self.matryoshka = matryoshka
        self._kv_cache_tokens = kv_cache_tokens
        self.token_delay_s = token_delay_s
        self.running: set[str] = set()
        self.aborted: list[str] = []
        self.started = False
        self.started_event = threading.Event()  # set by start(); stays set
        self.dead = False
        self._generated = 0
        self._cache_queries = self._cache_hits = 0
        self.block_tokens = block_tokens
        self.prefill_s_per_token = prefill_s_per_token
        self.decode_s_per_batch = decode_s_per_batch
        self._cache = BlockLRU(kv_cache_tokens // block_tokens)
        self._prefill_lane: asyncio.Lock | None = None  # made on first use, in the loop that drives the engine
        self._prompted = 0

    def start(self) -> None:
        self.started = True
        self.started_event.set()
        self._changed()

    # -- the Engine interface ----------------------------------------------------------------

    @property
    def kv_cache_tokens(self) -> int:
        return self._kv_cache_tokens

    @property
    def cache_block_tokens(self) -> int:
        return self.block_tokens

    @property
    def max_token_chars(self) -> int:
        return 1  # one token per UTF-8 byte, and a character is at least one byte

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    **template: Any) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}{calls_text(m)}\n" for m in messages)
        if template.get("continue_final_message"):
            text = text[:-1]  # the final message left open
        elif template.get("add_generation_prompt", True):
            text += "<|assistant|>"
        extra = {k: v for k, v in template.items() if k not in ("add_generation_prompt", "continue_final_message")}
        if extra:
            text = "".join(f"<|{k}={v}|>" for k, v in sorted(extra.items())) + text
        if tools:  # the names only: the fake model's context is small
            text = "<|tools|>" + ",".join(t.get("function", {}).get("name", "") for t in tools) + "\n" + text
        return self.encode(text)

    def encode(self, text: str) -> list[int]:
        return list(text.encode("utf-8", errors="replace"))

    def decode(self, token_ids: list[int]) -> str:
        return bytes(t % 256 for t in token_ids).decode("utf-8", errors="replace")

    async def _step(self) -> None:
        """One engine step's time (`token_delay_s` and `decode_s_per_batch` per request running, or a yield to the
        loop), then dead if it was killed meanwhile."""
        await asyncio.sleep((self.token_delay_s + self.decode_s_per_batch * len(self.running)) or 0)
        if self.dead:
            raise EngineDead("fake engine died mid-request")

    async def _prefill(self, uncached_tokens: int) -> None:
        """The prompt's uncached tokens, prefilled in turn with every other prompt (the cost model's prefill)."""
        if not self.prefill_s_per_token or not uncached_tokens:
            return
        if self._prefill_lane is None:
            self._prefill_lane = asyncio.Lock()
        async with self._prefill_lane:
            await asyncio.sleep(self.prefill_s_per_token * uncached_tokens)

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: GenerationParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        if self.dead:
            raise EngineDead("fake engine is dead")
        check_schema(params)
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise EngineRejected("prompt plus max_tokens exceeds max_model_len")
        check_params(params)
        self.running.add(request_id)
        self._prompted += len(prompt_token_ids)
        cached, created = self._cached(tuple(prompt_token_ids), params.cache_salt)
        self._changed()
        try:
            await self._prefill(len(prompt_token_ids) - cached)
            # A continuation (app/engine/continuation.py) ends its prompt with this engine's ids: steps 0..k-1.
            first_step = _steps_done(prompt_token_ids)
            planned = replace(params, max_tokens=params.max_tokens + first_step,
                              min_tokens=params.min_tokens + first_step if params.min_tokens else 0)
            # Beams differ as samples do (each its own words), whatever the temperature.
            plans = [answer_words(replace(planned, temperature=1.0) if params.beam_search else planned, i)
                     for i in range(params.n)]
            replayed = sum(len(ids) for _, ids in params.parser_replay)
            stops = [StopStrings(params.stop, params.include_stop_str_in_output, params.min_tokens + replayed)
                     for _ in plans]
            for text, ids in params.parser_replay:  # auto tools: stop strings read the text before, as the parser
                stops[0].add(text, len(ids))
                stops[0].release(False)
            done = [False for _ in plans]
            step = first_step
            while not all(done):
                await self._step()
                choices = []
                # The stand-in for a tool-call parser finds the call in the first piece it reads: a
                # continuation's parser has read the pieces before (engine/vllm/tool_parsing.py).
                parser_fresh = step == first_step and not params.parser_replay
                for i, words in enumerate(plans):
                    if not done[i]:
                        choices.append(self._choice(i, step, words, stops[i], planned, parser_fresh))
                        done[i] = choices[-1].finish_reason is not None
                first = step == first_step
                step += 1
                yield GenerationDelta(choices=tuple(choices),
                                      prompt_token_ids=tuple(prompt_token_ids) if first and params.return_token_ids
                                      else None,
                                      cached_tokens=cached if first else None,
                                      created_cache_tokens=created if first else None,
                                      prompt_logprobs=prompt_logprobs(prompt_token_ids, params, self.decode) if first
                                      else None,
                                      prompt_first_token=self.decode(list(prompt_token_ids[:1]))
                                      if first and params.prompt_logprobs is not None and prompt_token_ids else None)
        finally:
            self.running.discard(request_id)
            self._changed()

    def _choice(self, i: int, step: int, words: list[str], stops: StopStrings,
                params: GenerationParams, parser_fresh: bool) -> ChoiceDelta:
        """Choice `i`'s output at `step` (`params` with max_tokens counted from the continuation's start)."""
        token = words[step] if step < len(words) else ""
        matched = stops.add(token, 1)
        finish = None
        if matched is not None:
            finish = "stop"
        elif step + 1 >= params.max_tokens:
            finish = "length"
        elif step + 1 >= len(words):
            finish = "stop"
        calls: tuple[ToolCallDelta, ...] = ()
        if params.auto_tools and parser_fresh:  # "the model called" the first tool: a parser found it
            calls = (auto_call(params.auto_tools[0], i),)
        self._generated += 1
        return ChoiceDelta(index=i, text=stops.release(finish is not None), num_tokens=1, finish_reason=finish,
                           logprobs=token_logprobs(params, step, token, self.decode), tool_calls=calls,
                           stop_reason=matched, token_ids=(step % VOCAB_SIZE,) if params.return_token_ids else None,
                           parsed_text=token if params.auto_tools else None)

    @property
    def embedding_facts(self) -> EmbeddingFacts:
        sizes = self.matryoshka if isinstance(self.matryoshka, tuple) else None
        return EmbeddingFacts(size=EMBEDDING_SIZE, matryoshka=bool(self.matryoshka), dimensions=sizes)

    async def embed(self, request_id: str, prompt_token_ids: list[int], dimensions: int | None) -> tuple[float, ...]:
        if self.dead:
            raise EngineDead("fake engine is dead")
        invalid = [t for t in prompt_token_ids if not 0 <= t < VOCAB_SIZE]
        if invalid:  # vLLM's renderer refuses such a prompt as it is added
            raise EngineRejected(f"Token id {invalid[0]} is out of vocabulary")
        self.running.add(request_id)
        self._prompted += len(prompt_token_ids)
        self._changed()
        try:
            await self._step()
            values = [sum(math.sin((t + 1) * (k + 1) * 0.37 + p * 0.11) for p, t in enumerate(prompt_token_ids))
                      for k in range(EMBEDDING_SIZE)]
            values = values[:dimensions] if dimensions else values  # Matryoshka: the first values, renormalized
            norm = math.sqrt(sum(v * v for v in values)) or 1.0
            return tuple(float32(v / norm) for v in values)
        finally:
            self.running.discard(request_id)
            self._changed()

    async def abort(self, request_id: str) -> None:
        self.aborted.append(request_id)
        self.running.discard(request_id)
        self._changed()

    async def check_health(self) -> None:
        if self.dead:
            raise EngineDead("fake engine is dead")

    def _cached(self, prompt: tuple[int, ...], salt: str | None) -> tuple[int, int]:
        """As vLLM's prefix cache: the tokens found (the leading whole blocks held, never the last token) and those
        written (the whole blocks held after, less those found); least recently used blocks are evicted."""
        names = block_hashes(prompt, self.block_tokens, salt)
        hit = self._cache.match(names[:cacheable_blocks(len(prompt), self.block_tokens)], touch=True)
        self._cache.add(names)
        self._cache_queries += len(prompt)
        found = hit * self.block_tokens
        self._cache_hits += found
        return found, max(0, min(len(names) * self.block_tokens, len(prompt)) - found)

    def stats(self) -> EngineStats:
        return EngineStats(
            running=len(self.running), prompt_tokens_total=self._prompted, generation_tokens_total=self._generated,
            prefix_cache_queries_total=self._cache_queries, prefix_cache_hits_total=self._cache_hits
        )

    def kill(self) -> None:
        self.dead = True
        self._changed()

    def shutdown(self) -> None:
        self.started = False
        self._changed()


