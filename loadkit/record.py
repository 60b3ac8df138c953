"""One request as its client saw it: the record every experiment keeps per request, whatever sent it.

Times are `time.monotonic()` seconds (on Linux one clock for every process of the machine, so a helper process's
records line up with the driver's). `outcome` is the sending client's word for how it ended (each client's
docstring lists its own); `status` and `code` are the answer's HTTP status and OpenAI error code, when there was
an answer. What was asked (`ask`, a request of a workload mix) and what kind of request it was (`kind`) are there
where the experiment has more than one.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

from loadkit.workload import Ask


@dataclass
class Attempt:
    """One HTTP exchange of a request: its status (None: no response) and seconds to the response's headers (or
    to the error)."""

    status: int | None
    seconds: float
    error: str = ""
    retry_after: str | None = None  # the response's Retry-After header, as sent


@dataclass
class Record:
    start: float  # when it was sent (its first attempt)
    end: float = 0.0
    outcome: str = ""
    status: int | None = None
    code: str | None = None  # an error answer's OpenAI `code` (queue_full, over_time_target, queue_timeout, ...)
    detail: str = ""  # the error, for the report
    ask: Ask | None = None
    kind: str = ""
    scheduled: float = 0.0  # when a schedule said it should be sent (start - scheduled: the sender's own lag)
    ttft: float | None = None  # streaming: seconds from `start` to the first content
    output_tokens: int = 0
    prompt_tokens: int = 0  # as the service counted them (usage)
    retry_after: float | None = None  # the last answer's Retry-After, in seconds
    request_id: str = ""  # sent as X-Request-Id, so the service's own log lines can be joined
    longest_wait_s: float = 0.0  # the longest the client waited for anything: the first byte, or between chunks
    attempts: list[Attempt] = field(default_factory=list)  # every exchange on the wire, where they are counted
    chunk_times: list[float] | None = None  # when asked for: when each content chunk arrived

    @property
    def latency(self) -> float:
        return self.end - self.start

    @property
    def label(self) -> str:
        """'200', '429 queue_full', or, with no answer, the outcome ('hung', 'timeout', ...)."""
        if self.status is None:
            return self.outcome or "?"
        return f"{self.status} {self.code}" if self.code else str(self.status)

    @classmethod
    def from_dict(cls, d: dict) -> Record:
        """From its JSON form (asdict); fields a file of an older version lacks take their defaults."""
        names = {f.name for f in fields(cls)}
        values = {k: v for k, v in d.items() if k in names}
        if values.get("ask") is not None:
            values["ask"] = Ask(**values["ask"])
        values["attempts"] = [Attempt(**a) for a in values.get("attempts") or []]
        return cls(**values)
