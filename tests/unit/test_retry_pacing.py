"""RetryPacing (app/http/retry_pacing.py): a connection back before its Retry-After waits it out at the front door,
per connection and tenant, bounded; and on the in-process stack, a client that retries a refusal at once is held
until the service can take it instead of being refused again."""

from __future__ import annotations

import asyncio

from app.config.app_config import parse_config
from app.engine.fake import FakeEngine
from app.host.replica_load import ReplicaLoad
from app.http.retry_pacing import EARLY_LOOK_S, MAX_HOLD_S, RetryPacing
from tests.support.fake_stack import MAX_MODEL_LEN, chat_body, config_dict
from tests.support.waiting import until

A = ("10.0.0.1", 5000, "team-a")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def refused(after: bytes) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"Retry-After", after)]


def test_a_refusal_holds_that_connection_until_its_retry_after_and_no_other():
    clock = Clock()
    pacing = RetryPacing(clock)
    assert pacing.hold_s(A) == 0
    pacing.answered(A, 429, refused(b"3"))
    assert pacing.hold_s(A) == 3
    assert pacing.hold_s(("10.0.0.1", 5001, "team-a")) == 0  # another connection of the same client
    assert pacing.hold_s(("10.0.0.1", 5000, "team-b")) == 0  # another tenant over the same (proxied) connection
    clock.now += 2
    assert pacing.hold_s(A) == 1
    clock.now += 1
    assert pacing.hold_s(A) == 0


def test_only_a_refusal_with_a_retry_after_holds_and_any_other_answer_clears_it():
    clock = Clock()
    pacing = RetryPacing(clock)
    pacing.answered(A, 400, refused(b"5"))  # a bad request is not a refusal to retry
    pacing.answered(A, 429, [])  # no Retry-After: nothing to keep to
    assert pacing.hold_s(A) == 0
    pacing.answered(A, 503, refused(b"5"))
    pacing.answered(A, 200, [])
    assert pacing.hold_s(A) == 0
    pacing.answered(A, 429, refused(b"soon"))
    assert pacing.hold_s(A) == 0
    pacing.answered(None, 429, refused(b"5"))
    assert pacing.hold_s(None) == 0


def test_holds_are_bounded_in_time_and_in_connections_remembered():
    clock = Clock()
    pacing = RetryPacing(clock)
    pacing.answered(A, 429, refused(b"600"))
    assert pacing.hold_s(A) == MAX_HOLD_S
    for port in range(10_000):
        pacing.answered(("10.0.0.2", port, "t"), 429, refused(b"1"))
    assert len(pacing._not_before) <= 4096
    clock.now += 2  # the short ones have passed: room again
    pacing.answered(("10.0.0.3", 1, "t"), 429, refused(b"1"))
    assert pacing.hold_s(("10.0.0.3", 1, "t")) == 1


async def test_a_held_request_is_let_in_early_when_there_is_room_one_per_look():
    """A Retry-After is a prediction: a held request comes in once the service says it has room, and a crowd held
    together is let in one per look, not all at once. The clock stands still here, so only room ends a hold."""
    clock = Clock()
    pacing = RetryPacing(clock)
    connections = [("10.0.0.1", port, "t") for port in (1, 2)]
    for connection in connections:
        pacing.answered(connection, 429, refused(b"60"))
    room = [False]
    holds = [asyncio.create_task(pacing.hold(c, lambda: room[0])) for c in connections]
    await asyncio.sleep(3 * EARLY_LOOK_S)
    assert not any(h.done() for h in holds)  # no room and no time passed: both held
    room[0] = True
    clock.now += EARLY_LOOK_S  # the next look
    await until(lambda: any(h.done() for h in holds), what="one held request let in")
    await asyncio.sleep(3 * EARLY_LOOK_S)
    assert sum(h.done() for h in holds) == 1  # one per look, and the clock has not reached the next look
    clock.now += EARLY_LOOK_S
    await until(lambda: all(h.done() for h in holds), what="the other let in at the next look")
    assert all(h.result() for h in holds)


async def test_without_room_a_hold_lasts_until_the_retry_after_and_a_fresh_connection_is_not_held():
    clock = Clock()
    pacing = RetryPacing(clock)
    assert await pacing.hold(A, lambda: True) is False
    pacing.answered(A, 429, refused(b"2"))
    hold = asyncio.create_task(pacing.hold(A, lambda: False))
    await asyncio.sleep(3 * EARLY_LOOK_S)
    assert not hold.done()
    clock.now += 2
    await until(hold.done, what="the hold over at its Retry-After")
    assert hold.result() is True


def test_a_replica_would_take_a_request_when_serving_with_a_place_and_a_first_token_in_time():
    assert ReplicaLoad(room=1, wait_s=None).would_take(10.0)  # pace not measured yet: by count alone
    assert ReplicaLoad(room=1, wait_s=9.0).would_take(10.0) and ReplicaLoad(room=1, wait_s=99).would_take(None)
    assert not ReplicaLoad(room=1, wait_s=11.0).would_take(10.0)
    assert not ReplicaLoad(room=0, wait_s=0.0).would_take(10.0)
    assert not ReplicaLoad(serving=False, room=5).would_take(10.0)


async def test_a_retry_at_once_is_held_until_the_service_can_take_it(make_stack):
    """One slot, no queue: a second request of the tenant is refused (429 with Retry-After); retried at once on the
    same connection (the in-process client is one connection), it is held until then, when the first has ended, and
    is served instead of refused again."""
    data = config_dict(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    stack = make_stack(parse_config(data), FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.05))
    c = stack.client
    first = asyncio.create_task(c.post("/v1/chat/completions", json=chat_body("first", max_tokens=16)))
    await until(lambda: stack.host.admission.stats().in_system == 1, what="the first request running")
    second = await c.post("/v1/chat/completions", json=chat_body("second", max_tokens=2))
    assert second.status_code == 429 and int(second.headers["retry-after"]) >= 1, second.text
    again = await c.post("/v1/chat/completions", json=chat_body("second", max_tokens=2))
    assert again.status_code == 200, again.text
    assert (await first).status_code == 200
    assert "app_retries_held_total 1.0" in (await c.get("/metrics")).text
