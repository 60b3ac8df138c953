"""loadkit.burst (scripts/burst.py, issue 15's opening scenario): every request of the burst sent once through the
real `openai` SDK over a mock transport, and the summary and checks a user reads. No service is started."""

from __future__ import annotations

import asyncio
import json

import httpx
import httpx2

from loadkit.burst import BurstResult, honest, outcome_key, run_burst, summary
from loadkit.record import Attempt, Record
from loadkit.sdk import make_client, send
from loadkit.workload import Ask, PromptMaker

ASK = Ask(index=0, prompt_tokens=50, max_tokens=4, stream=True)


def rec(outcome: str, latency: float, ttft: float | None = None, status: int | None = 200, code: str | None = None,
        retry_after: str | None = None) -> Record:
    return Record(ask=ASK, start=0.0, end=latency, outcome=outcome, status=status, code=code, ttft=ttft,
                  attempts=[Attempt(status, latency, retry_after=retry_after)])


def test_a_refusal_keeps_its_code_and_retry_after_and_is_sent_once():
    calls = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(json.loads(request.content)["model"])
        return httpx2.Response(429, headers={"retry-after": "7"},
                               json={"error": {"message": "later", "type": "rate_limit_error", "param": None,
                                               "code": "over_time_target"}})

    async def go() -> Record:
        client, log = make_client("http://test", 5.0, inner=httpx2.MockTransport(handler), max_retries=0)
        try:
            return await send(client, log, "m", PromptMaker(), Record(ask=ASK, start=0.0))
        finally:
            await client.close()

    r = asyncio.run(go())
    assert calls == ["m"]  # no retry
    assert (r.outcome, r.status, r.code, r.attempts[0].retry_after) == ("refused", 429, "over_time_target", "7")
    assert outcome_key(r) == "429 over_time_target"


def test_the_summary_and_checks_of_an_honest_burst():
    served = [rec("ok", 20.0, ttft=t) for t in (1.0, 4.0, 9.5)]
    refused = [rec("refused", 0.004, status=429, code="over_time_target", retry_after="12") for _ in range(5)]
    result = BurstResult(served + refused, 21.0, 10.0)
    text = "\n".join(summary(result))
    assert "200: 3, 429 over_time_target: 5" in text
    assert "3 of 3 within the 10 s target" in text
    assert "Refused: 5, answered in p50 / p99 / max 4 / 4 / 4 ms; Retry-After on 5 of them, 12-12 s" in text
    assert "Waited only to be refused (503 queue_timeout): 0." in text
    assert all(line.startswith("- PASS") for line in honest(result))


def test_the_checks_fail_on_late_first_tokens_queue_timeouts_and_refusals_without_retry_after():
    recs = [rec("ok", 40.0, ttft=33.0), rec("timed_out", 30.0, status=503, code="queue_timeout", retry_after="1"),
            rec("refused", 0.01, status=503, code="starting")]
    lines = honest(BurstResult(recs, 40.0, 10.0))
    assert [ln.split(":")[0] for ln in lines] == ["- FAIL"] * 3, lines
    text = "\n".join(summary(BurstResult(recs, 40.0, 10.0)))
    assert "Waited only to be refused (503 queue_timeout): 1, after 30.0-30.0 s." in text


def test_run_burst_says_clearly_when_no_service_listens():
    try:
        asyncio.run(run_burst("http://127.0.0.1:9", 2, 1, None, None, 5.0, 10.0))
    except httpx.HTTPError:
        return
    raise AssertionError("no error without a service")

