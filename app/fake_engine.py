"""A deterministic engine behind the `Engine` interface, for fast tests.

One token is one byte of UTF-8 for prompts (a vocabulary of 256 ids, which token ids in
`logit_bias`, `allowed_token_ids` and `stop_token_ids` must be within, as vLLM checks them);
the output is a fixed sentence of word tokens (then end-of-sequence), numbered words when
`ignore_eos` is set, and numbered words after the sentence until `min_tokens`. Stop strings
end the text before them, or after them with `include_stop_str_in_output`; vLLM's other
sampling extensions are accepted and have no effect.
Embeddings (`embed`): a vector of `EMBEDDING_SIZE` values computed from the token ids (each id at its position),
L2-normalized as vLLM's pooler normalizes, every value a float32 (so base64's float32 round-trips exactly);
`matryoshka` says whether `dimensions` may shorten it (and to which sizes).
`token_delay_s` makes generation take time, so admission and cancellation can be
tested; `kill()` makes it behave like a dead engine.

Tests wait for what the engine does, never for a fixed time: `await engine.wait_started()`,
`await engine.wait_running(n)` (n requests inside `generate` at once) and
`await engine.wait_aborted(request_id)` (or a count) return as soon as that is true and raise
`TimeoutError` if it is not within `timeout_s`. They work from any event loop or thread (the engine
may be driven by another thread's loop, or started in a background thread).
"""

from __future__ import annotations

import asyncio
import json
import math
import struct
import threading
from collections.abc import AsyncGenerator, Callable
from typing import Any

from app.engine import (
    ChoiceDelta,
    EmbeddingFacts,
    EngineDead,
    EngineRejected,
    EngineStats,
    GenerationDelta,
    GenerationParams,
    PromptTokenLogprob,
    TokenLogprob,
    ToolCallDelta,
)
from app.errors import InvalidRequest

ANSWER = "This is a fake answer from the test engine."
VOCAB_SIZE = 256
CACHE_BLOCK_TOKENS = 16  # vLLM's default block size: its prefix cache hits whole blocks
EMBEDDING_SIZE = 32


class FakeEngine:
    def __init__(self, max_model_len: int = 2048, kv_cache_tokens: int = 100_000, token_delay_s: float = 0.0,
                 matryoshka: bool | tuple[int, ...] = False):
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
        self._seen_prompts: list[tuple[int, ...]] = []  # the prefix cache it pretends to have (the latest prompts)
        self._prompted = 0
        # Futures of tests waiting for a change, with their loops: woken (thread-safely) on every change.
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._waiters_lock = threading.Lock()

    def start(self) -> None:
        self.started = True
        self.started_event.set()
        self._changed()

    # -- waiting for what the engine does (tests) --------------------------------------------

    def _changed(self) -> None:
        with self._waiters_lock:
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            try:
                loop.call_soon_threadsafe(_wake, future)
            except RuntimeError:  # that loop is closed: nobody waits there any more
                pass

    async def wait_until(self, condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
        """Return once `condition()` (about this engine's state) is true; re-checked on every change of the
        engine's state. `TimeoutError` naming `what` if it is still false after `timeout_s`."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while True:
            future = loop.create_future()
            with self._waiters_lock:
                self._waiters.append((loop, future))
            if condition():  # checked after registering, so a change in between is not missed
                future.cancel()
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                future.cancel()
                raise TimeoutError(f"fake engine: not {what or 'true'} within {timeout_s} s; "
                                   f"running={sorted(self.running)} aborted={self.aborted}")
            try:
                await asyncio.wait_for(future, remaining)
            except TimeoutError:
                pass  # checked once more above, then reported

    async def wait_started(self, timeout_s: float = 5.0) -> None:
        await self.wait_until(self.started_event.is_set, timeout_s, "started")

    async def wait_running(self, count: int = 1, timeout_s: float = 5.0) -> None:
        """Until at least `count` requests are inside `generate` at once."""
        await self.wait_until(lambda: len(self.running) >= count, timeout_s, f"{count} request(s) running")

    async def wait_aborted(self, request_id: str | None = None, count: int = 1, timeout_s: float = 5.0) -> None:
        """Until `request_id` was aborted, or (without one) at least `count` aborts happened."""
        if request_id is not None:
            await self.wait_until(lambda: request_id in self.aborted, timeout_s, f"{request_id} aborted")
        else:
            await self.wait_until(lambda: len(self.aborted) >= count, timeout_s, f"{count} abort(s)")

    # -- the Engine interface ----------------------------------------------------------------

    @property
    def kv_cache_tokens(self) -> int:
        return self._kv_cache_tokens

    @property
    def max_token_chars(self) -> int:
        return 1  # one token per UTF-8 byte, and a character is at least one byte

    def render_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None,
                    **template: Any) -> list[int]:
        text = "".join(f"<|{m['role']}|>{m['content']}{_calls(m)}\n" for m in messages)
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

    def _words(self, params: GenerationParams, index: int) -> list[str]:
        if params.json_schema is not None and params.json_schema_param == "tools":
            # The smallest instance of the schema, in pieces of 5 characters: streamed tool calls get split
            # arguments, as a real engine's tokens split them.
            text = json.dumps(schema_instance(params.json_schema, params.json_schema))
            return [text[i : i + 5] for i in range(0, len(text), 5)]
        if params.json_schema is not None or params.json_object:
            return ['{"fake": ', "true}"]
        if params.choice is not None:
            return [params.choice[0]]
        if params.regex is not None or params.grammar is not None:
            return ["fake"]
        if params.ignore_eos:
            offset = (params.seed or 0) + index * 1000 if params.temperature > 0 else 0
            return [f"w{offset + i} " for i in range(params.max_tokens)]
        words = ANSWER.split(" ")
        if params.temperature > 0 and (params.seed is not None or index):
            words = [f"{w}{(params.seed or 0) + index}" for w in words]
        if params.min_tokens > len(words):  # end-of-sequence is masked until min_tokens
            words = words + [f"w{i}" for i in range(params.min_tokens - len(words))]
        return [w + " " for w in words[:-1]] + [words[-1]]

    @staticmethod
    def _check(params: GenerationParams) -> None:
        """What vLLM refuses once it knows the model (the vocabulary) and the final max_tokens."""
        for name, ids in (
            ("logit_bias", [t for t, _ in params.logit_bias]),
            ("allowed_token_ids", list(params.allowed_token_ids or ())),
            ("stop_token_ids", list(params.stop_token_ids)),
        ):
            invalid = [t for t in ids if not 0 <= t < VOCAB_SIZE]
            if invalid:
                raise InvalidRequest(
                    f"token_id(s) {invalid} in {name} contain out-of-vocab token ids. Vocabulary size: {VOCAB_SIZE}",
                    param=name,
                )
        if params.min_tokens > params.max_tokens:
            raise InvalidRequest(
                f"min_tokens must be less than or equal to max_tokens={params.max_tokens}, got {params.min_tokens}.",
                param="min_tokens",
            )

    async def _step(self) -> None:
        """One engine step's time (`token_delay_s`, or a yield to the loop), then dead if it was killed meanwhile."""
        await asyncio.sleep(self.token_delay_s or 0)
        if self.dead:
            raise EngineDead("fake engine died mid-request")

    async def generate(
        self, request_id: str, prompt_token_ids: list[int], params: GenerationParams
    ) -> AsyncGenerator[GenerationDelta, None]:
        if self.dead:
            raise EngineDead("fake engine is dead")
        if params.json_schema is not None:
            try:
                import jsonschema

                jsonschema.Draft202012Validator.check_schema(params.json_schema)
            except Exception as err:
                if params.json_schema_param != "response_format":  # vLLM's engine names the tools the same way
                    raise InvalidRequest(f"invalid JSON schema: {err}", param=params.json_schema_param) from None
                raise EngineRejected(f"invalid JSON schema: {err}") from None
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise EngineRejected("prompt plus max_tokens exceeds max_model_len")
        self._check(params)
        self.running.add(request_id)
        self._prompted += len(prompt_token_ids)
        cached = self._cached(tuple(prompt_token_ids))
        self._changed()
        try:
            plans = [self._words(params, i) for i in range(params.n)]
            texts = ["" for _ in plans]
            done = [False for _ in plans]
            step = 0
            while not all(done):
                await self._step()
                choices = []
                for i, words in enumerate(plans):
                    if done[i]:
                        continue
                    word = words[step] if step < len(words) else ""
                    texts[i] += word
                    finish = None
                    stop_at = min((texts[i].find(s) for s in params.stop if s in texts[i]), default=-1)
                    if stop_at >= 0:
                        if params.include_stop_str_in_output:  # the text ends after the stop string instead
                            stop_at += len(next(s for s in params.stop if texts[i].find(s) == stop_at))
                        cut = len(texts[i]) - stop_at  # characters of this word at or past the stop string
                        word = word[: len(word) - cut] if len(texts[i]) - len(word) <= stop_at else ""
                        finish = "stop"
                    elif step + 1 >= params.max_tokens:
                        finish = "length"
                    elif step + 1 >= len(words):
                        finish = "stop"
                    logprobs = None
                    if params.logprobs is not None:
                        name = f"token_id:{step % VOCAB_SIZE}" if params.tokens_as_ids else word
                        top = tuple((f"token_id:{VOCAB_SIZE - 1 - k}" if params.tokens_as_ids else f"alt{k}", -1.0 - k)
                                    for k in range(params.logprobs))
                        ranked = ((name, -0.5),) + top[: max(0, params.logprobs - 1)] if params.logprobs else ()
                        logprobs = (TokenLogprob(token=name, logprob=-0.5, top=ranked),)
                    calls: tuple[ToolCallDelta, ...] = ()
                    if params.auto_tools and step == 0:  # "the model called" the first tool: a parser found it
                        calls = (_auto_call(params.auto_tools[0], i),)
                    choices.append(
                        ChoiceDelta(index=i, text=word, num_tokens=1, finish_reason=finish, logprobs=logprobs,
                                    tool_calls=calls,
                                    token_ids=(step % VOCAB_SIZE,) if params.return_token_ids else None)
                    )
                    self._generated += 1
                    done[i] = finish is not None
                first = step == 0
                step += 1
                yield GenerationDelta(choices=tuple(choices),
                                      prompt_token_ids=tuple(prompt_token_ids) if first and params.return_token_ids
                                      else None,
                                      cached_tokens=cached if first else None,
                                      prompt_logprobs=self._prompt_logprobs(prompt_token_ids, params) if first
                                      else None,
                                      prompt_first_token=self.decode(list(prompt_token_ids[:1]))
                                      if first and params.prompt_logprobs is not None and prompt_token_ids else None)
        finally:
            self.running.discard(request_id)
            self._changed()

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
            return tuple(_float32(v / norm) for v in values)
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

    def _prompt_logprobs(
        self, prompt: list[int], params: GenerationParams
    ) -> tuple[tuple[PromptTokenLogprob, ...] | None, ...] | None:
        """As vLLM's: None for the first token, then each token (rank 1 here) and `prompt_logprobs` others."""
        k = params.prompt_logprobs
        if k is None:
            return None

        def alternatives(t: int) -> tuple[PromptTokenLogprob, ...]:
            others = [o for o in range(VOCAB_SIZE) if o != t][:k]
            return (PromptTokenLogprob(t, -0.25, 1, self.decode([t])),
                    *(PromptTokenLogprob(o, -2.0 - r, r + 2, self.decode([o])) for r, o in enumerate(others)))
        return (None, *(alternatives(t) for t in prompt[1:]))

    def _cached(self, prompt: tuple[int, ...]) -> int:
        """As vLLM's prefix cache: whole blocks of `prompt` shared with an earlier prompt, never all of it (the
        last token is always computed)."""
        shared = 0
        for seen in self._seen_prompts:
            pairs = enumerate(zip(prompt, seen, strict=False))
            n = next((k for k, (a, b) in pairs if a != b), min(len(prompt), len(seen)))
            shared = max(shared, n)
        hit = min(shared, len(prompt) - 1) // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS
        self._seen_prompts = [*self._seen_prompts[-31:], prompt]
        self._cache_queries += len(prompt)
        self._cache_hits += hit
        return hit

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


def schema_instance(schema: Any, root: dict[str, Any], depth: int = 0) -> Any:
    """The smallest JSON value valid against `schema` for the schemas tests use (types, properties, required,
    enum, const, anyOf/oneOf, items with minItems, local `$ref`s); what a constrained decoder could produce."""
    if not isinstance(schema, dict) or depth > 32:
        return {}
    if "$ref" in schema:
        target: Any = root
        for part in str(schema["$ref"]).lstrip("#/").split("/"):
            target = target.get(part, {}) if isinstance(target, dict) else {}
        return schema_instance(target, root, depth + 1)
    if "const" in schema:
        return schema["const"]
    if schema.get("enum"):
        return schema["enum"][0]
    for key in ("anyOf", "oneOf"):
        if schema.get(key):
            return schema_instance({**schema, key: None, **schema[key][0]}, root, depth + 1)
    kind = schema.get("type", "object" if "properties" in schema else None)
    kind = kind[0] if isinstance(kind, list) and kind else kind
    if kind == "array":
        return [schema_instance(schema.get("items", {}), root, depth + 1) for _ in range(schema.get("minItems", 0))]
    if kind == "string":
        return "x" * int(schema.get("minLength", 1))
    if kind in ("integer", "number"):
        return schema.get("minimum", 0)
    if kind == "boolean":
        return True
    if kind == "null":
        return None
    properties = schema.get("properties") or {}
    return {name: schema_instance(sub, root, depth + 1) for name, sub in properties.items()}


def _auto_call(tool: dict[str, Any], choice: int) -> ToolCallDelta:
    function = tool.get("function", {})
    arguments = schema_instance(function.get("parameters") or {}, function.get("parameters") or {})
    return ToolCallDelta(index=0, id=f"call_fake{choice}", name=function.get("name"), arguments=json.dumps(arguments))


def _calls(message: dict[str, Any]) -> str:
    calls = message.get("tool_calls")
    tool = f"[{message['tool_call_id']}]" if message.get("tool_call_id") else ""
    return tool + ("<|calls|>" + ",".join(c["function"]["name"] for c in calls) if calls else "")


def _float32(value: float) -> float:
    return float(struct.unpack("<f", struct.pack("<f", value))[0])


def _wake(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)

