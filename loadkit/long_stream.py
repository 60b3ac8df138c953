"""A long stream through the real `openai` SDK, for the tests and the chaos driver that break a replica under it:
each choice's text, finish and stop reason, the usage, the longest wait between its chunks, or the error that
broke it. `answer()` is what a client got, to compare with the same request run undisturbed (its twin)."""

from __future__ import annotations

import threading
import time
from typing import Any

import openai

# ignore_eos (sent as extra_body): every run is max_tokens long, so a cut-short answer cannot pass for a whole one.
LONG = {"messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
        "max_tokens": 96, "temperature": 0}


class LongStream(threading.Thread):
    def __init__(self, base_url: str, api_key: str, model: str, **request: Any):
        """`request`: the chat request's fields (LONG's by default; `ignore_eos` and any other vLLM field go in
        `extra_body`)."""
        super().__init__(daemon=True)
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.request = request or {**LONG, "extra_body": {"ignore_eos": True}}
        self.texts: dict[int, str] = {}
        self.calls: dict[int, dict[int, tuple[str, str]]] = {}  # choice -> call index -> (name, arguments so far)
        self.finishes: dict[int, tuple[str | None, Any]] = {}  # choice -> (finish_reason, stop_reason)
        self.usage, self.error, self.chunks = None, None, 0
        self.longest_gap_s = 0.0  # the longest wait for a chunk, the first included

    @property
    def text(self) -> str:
        return self.texts.get(0, "")

    @property
    def finish(self) -> str | None:
        return self.finishes.get(0, (None, None))[0]

    def run(self) -> None:
        try:
            with openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key, max_retries=0,
                               timeout=300) as c:
                stream = c.chat.completions.create(model=self.model, stream=True,
                                                   stream_options={"include_usage": True}, **self.request)
                last = time.monotonic()
                for chunk in stream:
                    now = time.monotonic()
                    self.longest_gap_s, last = max(self.longest_gap_s, now - last), now
                    if chunk.usage is not None:
                        self.usage = chunk.usage
                    for choice in chunk.choices:
                        self.texts[choice.index] = self.texts.get(choice.index, "") + (choice.delta.content or "")
                        for call in choice.delta.tool_calls or ():
                            calls = self.calls.setdefault(choice.index, {})
                            name, arguments = calls.get(call.index, ("", ""))
                            function = call.function
                            calls[call.index] = (name + (function.name or "" if function else ""),
                                                 arguments + (function.arguments or "" if function else ""))
                        self.chunks += 1
                        if choice.finish_reason:
                            stop = (choice.model_extra or {}).get("stop_reason")
                            self.finishes[choice.index] = (choice.finish_reason, stop)
        except Exception as err:  # recorded and asserted on: a broken stream is the failure under test
            self.error = f"{type(err).__name__}: {err}"

    def answer(self) -> tuple[Any, ...]:
        """Every choice's text, tool calls (names and arguments; their ids are new per request), finish and stop
        reason, and the completion tokens: what must equal the twin's."""
        return (sorted(self.texts.items()), sorted((i, sorted(c.items())) for i, c in self.calls.items()),
                sorted(self.finishes.items()), None if self.usage is None else self.usage.completion_tokens,
                self.error)

    def whole(self) -> str | None:
        """Why this stream (with `ignore_eos`, as LONG's) is not a whole answer of its max_tokens (None: it is)."""
        if self.error is not None:
            return self.error
        if self.finish != "length" or self.usage is None:
            return f"finish {self.finish!r}, usage {self.usage}"
        wanted = self.request.get("max_tokens", LONG["max_tokens"])
        if self.usage.completion_tokens != wanted:
            return f"{self.usage.completion_tokens} completion tokens, not {wanted}"
        return None
