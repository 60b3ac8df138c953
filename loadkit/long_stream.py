"""A long greedy stream through the real `openai` SDK, for the tests and the chaos driver that break a replica
under it: its text, finish reason and usage, the longest wait between its chunks, or the error that broke it."""

from __future__ import annotations

import threading
import time

import openai

# ignore_eos (sent as extra_body): every run is max_tokens long, so a cut-short answer cannot pass for a whole one.
LONG = {"messages": [{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}],
        "max_tokens": 96, "temperature": 0}


class LongStream(threading.Thread):
    def __init__(self, base_url: str, api_key: str, model: str):
        super().__init__(daemon=True)
        self.base_url, self.api_key, self.model = base_url, api_key, model
        self.text, self.finish, self.usage, self.error, self.chunks = "", None, None, None, 0
        self.longest_gap_s = 0.0  # the longest wait for a chunk, the first included

    def run(self) -> None:
        try:
            with openai.OpenAI(base_url=f"{self.base_url}/v1", api_key=self.api_key, max_retries=0,
                               timeout=300) as c:
                stream = c.chat.completions.create(model=self.model, stream=True,
                                                   stream_options={"include_usage": True},
                                                   extra_body={"ignore_eos": True}, **LONG)
                last = time.monotonic()
                for chunk in stream:
                    now = time.monotonic()
                    self.longest_gap_s, last = max(self.longest_gap_s, now - last), now
                    if chunk.usage is not None:
                        self.usage = chunk.usage
                    for choice in chunk.choices:
                        self.text += choice.delta.content or ""
                        self.chunks += 1
                        self.finish = choice.finish_reason or self.finish
        except Exception as err:  # recorded and asserted on: a broken stream is the failure under test
            self.error = f"{type(err).__name__}: {err}"

    def whole(self) -> str | None:
        """Why this stream is not a whole answer (None: it is)."""
        if self.error is not None:
            return self.error
        if self.finish != "length" or self.usage is None:
            return f"finish {self.finish!r}, usage {self.usage}"
        if self.usage.completion_tokens != LONG["max_tokens"]:
            return f"{self.usage.completion_tokens} completion tokens, not {LONG['max_tokens']}"
        return None
