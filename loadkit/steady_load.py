"""Steady load from the real `openai` SDK, for the tests and the chaos driver that change or break a running
deployment under it.

Each client loops until stopped: plain or streaming chat requests, greedy or sampled, with the SDK's retries
off (`max_retries=0`), so every failure the service lets through is seen and recorded. A stream counts as
served only when it ends with a `finish_reason`; one that stops without it is "broken". Each answer is a Record
whose outcome is SERVED, "broken", or the exception's type and message, with the HTTP status of an error answer and
the output tokens of a plain one (its usage).

Options for a load that measures rather than disturbs: one fixed `question`, `sampling` (the same sampling fields
for every request, `{}` for the service's defaults, instead of alternating greedy and seeded sampled requests),
`ignore_eos` (every answer `max_tokens` long), and `refused_pause_s` (a client refused with 429 waits that long
before it asks again).

    with SteadyLoad(base_url, api_key, model, plain=3, streaming=2) as load:
        ...change something...
        load.wait_served(10)                       # at least 10 more answers since the call
    load.failures(since=t)                         # the record of every non-served answer
"""

from __future__ import annotations

import threading
import time

import openai

from loadkit.record import Record
from loadkit.waiting import wait_until

SERVED = "served"
STREAM, PLAIN = "stream", "plain"  # the records' kinds


class SteadyLoad:
    def __init__(self, base_url: str, api_key: str, model: str, plain: int = 3, streaming: int = 2,
                 max_tokens: int = 12, timeout_s: float = 120, question: str | None = None,
                 sampling: dict | None = None, ignore_eos: bool = False, refused_pause_s: float = 0.0):
        self._clients = [openai.OpenAI(base_url=f"{base_url}/v1", api_key=api_key, max_retries=0, timeout=timeout_s)
                         for _ in range(plain + streaming)]
        self._streaming = [False] * plain + [True] * streaming
        self._model = model
        self._max_tokens = max_tokens
        self._question, self._sampling = question, sampling
        self._ignore_eos, self._refused_pause_s = ignore_eos, refused_pause_s
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self.outcomes: list[Record] = []
        self._threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(len(self._clients))]

    def __enter__(self) -> SteadyLoad:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(timeout=180)
        for c in self._clients:
            c.close()

    def _body(self, i: int, n: int) -> dict:
        greedy = (i + n) % 2 == 0  # each client alternates greedy and sampled requests
        question = self._question or ["What is the capital of France?", "Name three colours.",
                                      "Count from one to ten."][n % 3]
        sampling = {"temperature": 0 if greedy else 0.8, "seed": None if greedy else n} if self._sampling is None \
            else self._sampling
        body = {"model": self._model, "messages": [{"role": "user", "content": question}],
                "max_tokens": self._max_tokens, **sampling}
        return {**body, "extra_body": {"ignore_eos": True}} if self._ignore_eos else body

    def _run(self, i: int) -> None:
        client, streaming, n = self._clients[i], self._streaming[i], 0
        while not self._stop.is_set():
            n += 1
            sent = last = time.monotonic()
            longest, status, tokens = 0.0, None, 0
            try:
                if streaming:
                    finish = None
                    for chunk in client.chat.completions.create(**self._body(i, n), stream=True):
                        now = time.monotonic()
                        longest, last = max(longest, now - last), now
                        if chunk.choices and chunk.choices[0].finish_reason:
                            finish = chunk.choices[0].finish_reason
                    result = SERVED if finish else "broken"
                else:
                    answer = client.chat.completions.create(**self._body(i, n))
                    result = SERVED if answer.choices[0].finish_reason else "broken"
                    tokens = answer.usage.completion_tokens if answer.usage else 0
            except Exception as err:  # every failure is the finding: recorded, never raised in the thread
                result = f"{type(err).__name__}: {str(err)[:200]}"
                status = getattr(err, "status_code", None)
            ended = time.monotonic()
            longest = max(longest, ended - last)  # a plain answer: its whole time
            with self._lock:
                self.outcomes.append(Record(sent, ended, result, status=status, kind=STREAM if streaming else PLAIN,
                                            output_tokens=tokens, longest_wait_s=longest))
            if status == 429 and self._refused_pause_s:
                self._stop.wait(self._refused_pause_s)

    def served(self) -> int:
        with self._lock:
            return sum(o.outcome == SERVED for o in self.outcomes)

    def wait_served(self, more: int, timeout_s: float = 300, what: str = "") -> None:
        target = self.served() + more
        wait_until(lambda: self.served() >= target, timeout_s=timeout_s, what=what or f"{more} more answers served")

    def since(self, t: float) -> list[Record]:
        with self._lock:
            return [o for o in self.outcomes if o.start >= t]

    def failures(self, since: float = 0.0) -> list[Record]:
        return [o for o in self.since(since) if o.outcome != SERVED]

    def summary(self, since: float = 0.0) -> str:
        got = self.since(since)
        failed = [o.outcome for o in got if o.outcome != SERVED]
        return f"{len(got)} requests, {len(got) - len(failed)} served, failures: {failed[:8]}"

