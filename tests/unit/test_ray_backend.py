"""`app/rayserve/handle_backend.py`: the ingress' side of the Ray handle. `translate` gives back the service's own
errors for what Ray wraps or raises; `HandleBackend` against a stand-in handle: values pass through, a
`Refused` value raises its error, every call's failure is translated, and the remote stream is always
cancelled in the end (which stops the replica's generator when the caller went away)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError, TaskCancelledError
from ray.serve._private.common import DeploymentID
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from app.config.service import ServiceConfig
from app.engine.interface import Admitted, ChoiceDelta, GenerateRequest, GenerationDelta, PromptInput
from app.errors import (
    InvalidRequest,
    NeverInTime,
    OverTimeTarget,
    QueueFull,
    RequestQuarantined,
    RequestTimeout,
    ServiceError,
    ServiceUnavailable,
)
from app.host.replica_load import ReplicaLoad
from app.rayserve.handle_backend import ATTEMPTS, HandleBackend, Refused, translate
from app.rayserve.scaling_view import ScalingView
from app.scaling.decision import ScalingDecision
from tests.support.fake_stack import make_config, make_request
from tests.support.stand_in_handle import StandInHandle, StandInResponse
from tests.support.waiting import until


def wrapped(cause: BaseException) -> RayTaskError:
    """What the caller of a replica gets when the replica raised `cause`: RayTaskError(<cause's class>)."""
    return RayTaskError("generate_remote", "Traceback (most recent call last): ...", cause).as_instanceof_cause()


# -- translate ---------------------------------------------------------------------------------

@pytest.mark.parametrize("cause", [QueueFull("full", retry_after_s=3), InvalidRequest("bad n", param="n"),
                                   RequestTimeout("too long"), ServiceUnavailable("starting", retry_after_s=5)],
                         ids=lambda e: type(e).__name__)
def test_a_service_error_raised_in_the_replica_comes_back_as_itself(cause):
    for err in (wrapped(cause), RayTaskError("generate_remote", "tb", cause)):
        back = translate(err)
        assert back is cause  # its class, status, param and Retry-After, not a RayTaskError
        assert isinstance(back, ServiceError) and not isinstance(back, RayTaskError)


def test_a_service_error_is_itself():
    err = InvalidRequest("bad", param="stop")
    assert translate(err) is err


def test_back_pressure_is_queue_full():
    back = translate(BackPressureError(num_queued_requests=5, max_queued_requests=4))
    assert type(back) is QueueFull
    assert back.status == 429 and back.retry_after_s == 1 and back.code == "queue_full"


def test_a_call_cancelled_under_us_is_a_503_to_retry():
    back = translate(TaskCancelledError())
    assert type(back) is ServiceUnavailable and back.status == 503 and back.retry_after_s == 1


@pytest.mark.parametrize("err", [ActorDiedError(), ActorUnavailableError("gone", None), RayActorError(),
                                 DeploymentUnavailableError(DeploymentID(name="engine", app_name="llm"))],
                         ids=lambda e: type(e).__name__)
def test_no_replica_to_answer_is_a_503_to_retry_later(err):
    back = translate(err)
    assert type(back) is ServiceUnavailable
    assert back.status == 503 and back.retry_after_s == 5 and back.code == "engine_unavailable"


def test_anything_else_is_left_alone():
    for err in (ValueError("a bug"), wrapped(KeyError("internal"))):
        assert translate(err) is err  # a 500 for the ingress' handler, logged there


# -- HandleBackend against a stand-in handle ---------------------------------------------------

ITEMS = [Admitted(prompt_tokens=3), GenerationDelta(choices=(ChoiceDelta(index=0, text="Hi", num_tokens=1),))]


def as_sent(request: GenerateRequest) -> GenerateRequest:
    """What the ingress sends a replica for `request`: the same, asking for the token ids (rayserve/migration.py)."""
    return replace(request, params=replace(request.params, return_token_ids=True))


async def test_generate_passes_items_through_and_cancels_when_done():
    handle = StandInHandle(StandInResponse(ITEMS))
    backend = HandleBackend(handle)
    request = make_request("hello")
    assert [item async for item in backend.generate(request)] == ITEMS
    assert handle.options_seen == [{"stream": True}]
    assert handle.calls == [("generate_remote", (as_sent(request), ()))]  # with the token ids a resume needs
    assert handle.response.cancelled == 1  # a no-op on a finished stream, but always called


async def test_a_refusal_about_the_request_raises_its_error_without_a_retry():
    refusal = InvalidRequest("too long", param="messages")
    handle = StandInHandle(StandInResponse([Refused(refusal, "r1"), *ITEMS]))
    with pytest.raises(InvalidRequest) as raised:
        async for _ in HandleBackend(handle).generate(make_request("hello")):
            pass
    assert raised.value is refusal
    assert handle.response.yielded == 1  # nothing after the refusal was read
    assert handle.response.cancelled == 1
    assert len(handle.calls) == 1


@pytest.mark.parametrize("refusal", [QueueFull("at capacity", retry_after_s=7),
                                     ServiceUnavailable("engine dead", retry_after_s=5)], ids=["full", "dead"])
async def test_a_replica_refusal_is_retried_on_another_replica_that_then_answers(refusal):
    full, other = StandInResponse([Refused(refusal, "r1")]), StandInResponse(ITEMS)
    handle = StandInHandle(responses=[full, other])
    request = make_request("hello")
    backend = HandleBackend(handle)
    assert [item async for item in backend.generate(request)] == ITEMS
    assert backend.retried == {refusal.code: 1}  # counted for /metrics (app_requests_retried_total)
    (_, (first, avoid_first)), (_, (second, avoid_second)) = handle.calls
    assert first == as_sent(request) and avoid_first == ()
    assert avoid_second == ("r1",)  # the router leaves r1 out (serving_router.avoided)
    assert second.request_id == request.request_id and second.timeout_s <= request.timeout_s  # the time left
    assert full.cancelled == other.cancelled == 1


async def test_when_every_attempt_is_refused_the_client_hears_the_last_refusal():
    refusals = [QueueFull(f"full {i}", retry_after_s=i) for i in range(ATTEMPTS)]
    handle = StandInHandle(responses=[StandInResponse([Refused(r, f"r{i}")]) for i, r in enumerate(refusals)])
    with pytest.raises(QueueFull) as raised:
        async for _ in HandleBackend(handle).generate(make_request("hello")):
            pass
    assert raised.value is refusals[-1]
    assert [avoid for _, (_, avoid) in handle.calls] == [(), ("r0",), ("r0", "r1")]


def fleet_of(backend: HandleBackend, *replicas: str) -> HandleBackend:
    """`backend` with `replicas` as the replicas its process's router knows (request_router.replica_loads)."""
    backend._loads = lambda: {r: ReplicaLoad() for r in replicas}  # type: ignore[method-assign]
    return backend


async def test_a_capacity_refusal_from_the_only_replica_is_not_tried_again():
    full = QueueFull("over its time target", retry_after_s=4)
    handle = StandInHandle(responses=[StandInResponse([Refused(full, "r1")]), StandInResponse(ITEMS)])
    backend = fleet_of(HandleBackend(handle), "r1")
    with pytest.raises(QueueFull) as raised:
        async for _ in backend.generate(make_request("hello")):
            pass
    assert raised.value is full and len(handle.calls) == 1 and not backend.retried


async def test_capacity_refusals_stop_once_every_known_replica_refused():
    refusals = [QueueFull(f"full {i}", retry_after_s=1) for i in range(2)]
    handle = StandInHandle(responses=[StandInResponse([Refused(r, f"r{i}")]) for i, r in enumerate(refusals)])
    backend = fleet_of(HandleBackend(handle), "r0", "r1")
    with pytest.raises(QueueFull) as raised:
        async for _ in backend.generate(make_request("hello")):
            pass
    assert raised.value is refusals[1]
    assert [avoid for _, (_, avoid) in handle.calls] == [(), ("r0",)]  # not a third time to r0 or r1


async def test_a_lone_replica_whose_engine_is_down_is_still_tried_again():
    down = StandInResponse([Refused(ServiceUnavailable("engine restarting", retry_after_s=5), "r1")])
    handle = StandInHandle(responses=[down, StandInResponse(ITEMS)])
    backend = fleet_of(HandleBackend(handle), "r1")
    assert [item async for item in backend.generate(make_request("hello"))] == ITEMS  # it may be back by then


async def test_a_request_whose_lone_replica_s_engine_broke_under_it_waits_for_it_and_a_second_break_holds_it(
        monkeypatch):
    """Behind the ingress tier with one replica: as the replica that serves HTTP itself (host/resuming_host.py), the
    ingress waits for the engine restarted in place and sends the request again, instead of a 503 whose retries the
    count per request would not link; a second break there holds it back (engine/quarantine.py)."""
    from app.rayserve import handle_backend

    monkeypatch.setattr(handle_backend, "REFUSED_PAUSE_S", 0.0)
    monkeypatch.setattr(handle_backend, "WAIT_POLL_S", 0.001)
    broke = ServiceUnavailable("the engine failed while serving this request", retry_after_s=5)
    handle = StandInHandle(responses=[StandInResponse([Refused(broke, "r1", in_flight=True)]), StandInResponse(ITEMS),
                                      StandInResponse([Refused(broke, "r1", in_flight=True)]),
                                      StandInResponse([Refused(broke, "r1", in_flight=True)])])
    backend, polls = HandleBackend(handle), []

    def loads() -> dict[str, ReplicaLoad]:
        polls.append(len(handle.calls))
        return {"r1": ReplicaLoad(serving=len(polls) % 30 > 20)}  # restarting for 20 looks of every 30

    backend._loads = loads  # type: ignore[method-assign]
    assert [item async for item in backend.generate(make_request("hello"))] == ITEMS
    assert set(polls[:20]) == {1} and [avoid for _, (_, avoid) in handle.calls] == [(), ()]  # r1 again, once back
    with pytest.raises(RequestQuarantined, match="failed 2 times"):
        async for _ in backend.generate(make_request("POISON")):
            pass
    assert len(handle.calls) == 4


async def test_a_replica_the_router_learned_of_after_the_refusal_is_tried():
    handle = StandInHandle(responses=[StandInResponse([Refused(QueueFull("full", retry_after_s=1), "r1")]),
                                      StandInResponse(ITEMS)])
    backend = fleet_of(HandleBackend(handle), "r1", "r2")  # r2 came up: a scale-up, or a replacement
    assert [item async for item in backend.generate(make_request("hello"))] == ITEMS
    assert [avoid for _, (_, avoid) in handle.calls] == [(), ("r1",)]


def starting_view(ready_in_s: float) -> ScalingView:
    """The view of an autoscaled deployment whose new replica is expected to serve in `ready_in_s`."""
    now = time.time()
    view = ScalingView(handle=None)  # type: ignore[arg-type]
    view._latest = ScalingDecision(desired=2, target=2, running=1, served=300.0, refused=200.0, capacity=320.0,
                                   wait_s=12.0, start_s=ready_in_s + 10, decided_at=now, starting_since=now - 10)
    view._read_at = float("inf")  # as if just read
    return view


@pytest.mark.parametrize("refusal, retry_after_s", [
    (OverTimeTarget("Server is busy", retry_after_s=3), 30),  # when the starting replica is expected
    (NeverInTime("too long even alone"), None),  # waiting cannot help it: as it was
    (QueueFull("full", retry_after_s=1), 1),  # not a refusal by time
], ids=["over-time", "never-in-time", "full"])
async def test_a_replica_s_refusal_by_time_says_when_the_starting_replica_serves(refusal, retry_after_s):
    handle = StandInHandle(responses=[StandInResponse([Refused(refusal, "r1")])])
    backend = autoscaled(fleet_of(HandleBackend(handle), "r1"))
    with pytest.raises(QueueFull) as raised:
        async for _ in backend.generate(make_request("hello")):
            pass
    assert raised.value.retry_after_s == retry_after_s
    assert ("expected to serve in about 30 s" in raised.value.message) == (retry_after_s == 30)


class Unmet:
    """Records what an autoscaled ingress counts as unmet demand (rayserve/unmet_demand.UnmetDemand)."""

    def __init__(self):
        self.requests: list[GenerateRequest] = []

    def refused(self, request: GenerateRequest) -> None:
        self.requests.append(request)


def autoscaled(backend: HandleBackend) -> HandleBackend:
    backend.unmet, backend.scaling = Unmet(), starting_view(30.0)  # type: ignore[assignment]
    return backend


async def test_an_autoscaled_ingress_counts_a_refusal_by_time_once_when_it_gives_up():
    late = [OverTimeTarget(f"late at r{i}", retry_after_s=2) for i in range(2)]
    handle = StandInHandle(responses=[StandInResponse([Refused(e, f"r{i}")]) for i, e in enumerate(late)])
    backend = autoscaled(fleet_of(HandleBackend(handle), "r0", "r1"))
    with pytest.raises(OverTimeTarget):
        async for _ in backend.generate(make_request("hello")):
            pass
    sent = [request for _, (request, *_) in handle.calls]
    assert all(r.demand_at_sender for r in sent)  # so neither replica counted it
    assert [r.request_id for r in backend.unmet.requests] == [sent[0].request_id]  # type: ignore[union-attr]


async def test_a_request_another_replica_took_is_no_unmet_demand():
    handle = StandInHandle(responses=[StandInResponse([Refused(OverTimeTarget("late", retry_after_s=2), "r0")]),
                                      StandInResponse(ITEMS)])
    backend = autoscaled(fleet_of(HandleBackend(handle), "r0", "r1"))
    assert [item async for item in backend.generate(make_request("hello"))] == ITEMS
    assert backend.unmet.requests == []  # type: ignore[union-attr]  # r1 counts it as served


async def test_a_replica_that_dies_before_answering_is_retried():
    died = StandInResponse([], fail=ActorDiedError())
    handle = StandInHandle(responses=[died, StandInResponse(ITEMS)])
    assert [item async for item in HandleBackend(handle).generate(make_request("hello"))] == ITEMS
    assert len(handle.calls) == 2


@pytest.mark.parametrize("fail, expected", [
    (wrapped(InvalidRequest("schema", param="response_format")), InvalidRequest),
    (BackPressureError(num_queued_requests=1, max_queued_requests=1), QueueFull),
], ids=["replica-raised", "back-pressure"])
async def test_stream_failures_are_translated_and_the_stream_cancelled(fail, expected):
    handle = StandInHandle(StandInResponse(ITEMS, fail=fail))
    seen = []
    with pytest.raises(expected) as raised:
        async for item in HandleBackend(handle).generate(make_request("hello")):
            seen.append(item)
    assert seen == ITEMS  # what came before the failure got through
    assert raised.value.__cause__ is None and raised.value.__suppress_context__  # no Ray traceback chained on
    assert handle.response.cancelled == 1


async def test_a_caller_that_stops_reading_cancels_the_remote_stream():
    handle = StandInHandle(StandInResponse(ITEMS))
    stream = HandleBackend(handle).generate(make_request("hello"))
    assert await anext(stream) == ITEMS[0]
    await stream.aclose()
    assert handle.response.cancelled == 1  # so the replica's generator sees CancelledError and aborts


async def test_a_cancelled_caller_cancels_the_remote_stream_and_stays_cancelled():
    hold = asyncio.Event()  # the replica is still generating
    handle = StandInHandle(StandInResponse(ITEMS, hold=hold))
    reading = asyncio.Event()

    async def consume():
        async for _ in HandleBackend(handle).generate(make_request("hello")):
            if handle.response.yielded == len(ITEMS):
                reading.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(reading.wait(), 5)  # it has read everything there is and waits for more
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert handle.response.cancelled == 1


async def test_a_failing_cancel_does_not_hide_the_answer():
    """cancel() re-raises a failed assignment (BackPressureError), which the stream already answered."""
    back_pressure = BackPressureError(num_queued_requests=1, max_queued_requests=1)
    handle = StandInHandle(StandInResponse([], fail=back_pressure, cancel_fails=back_pressure))
    with pytest.raises(QueueFull):
        async for _ in HandleBackend(handle).generate(make_request("hello")):
            pass
    finished = StandInHandle(StandInResponse(ITEMS, cancel_fails=RuntimeError("already finished")))
    assert [item async for item in HandleBackend(finished).generate(make_request("hello"))] == ITEMS


async def test_plain_calls_return_the_replicas_answers():
    stats = object()
    handle = StandInHandle(tokenize=[1, 2, 3], detokenize="abc", check_health=None, check_ready=None, stats=stats)
    backend = HandleBackend(handle)
    prompt = PromptInput(text="abc")
    assert await backend.tokenize(prompt) == [1, 2, 3]
    assert await backend.detokenize([1, 2, 3]) == "abc"
    assert await backend.check_health() is None
    assert await backend.check_ready() is None
    assert await backend.stats() is stats
    assert handle.calls == [("tokenize", (prompt,)), ("detokenize", ([1, 2, 3],)), ("check_health", ()),
                            ("check_ready", ()), ("stats", ())]


@pytest.mark.parametrize("method, args", [("tokenize", (PromptInput(text="x"),)), ("detokenize", ([1],)),
                                          ("check_health", ()), ("check_ready", ()), ("stats", ())])
async def test_plain_call_failures_are_translated(method, args):
    starting = ServiceUnavailable("the engine is starting", retry_after_s=5)
    for fail, expected in ((wrapped(starting), starting), (ActorUnavailableError("gone", None), ServiceUnavailable)):
        backend = HandleBackend(StandInHandle(**{method: fail}))
        with pytest.raises(ServiceUnavailable) as raised:
            await getattr(backend, method)(*args)
        if isinstance(expected, BaseException):
            assert raised.value is expected
        assert raised.value.__cause__ is None
    backend = HandleBackend(StandInHandle(**{method: ValueError("a bug")}))
    with pytest.raises(ValueError, match="a bug"):
        await getattr(backend, method)(*args)


def test_retries_are_counted_in_the_metrics_by_reason():
    from app.http.metrics import Metrics

    text = Metrics().render({}, {"m": {"queue_full": 2, "engine_unavailable": 1}}).decode()
    assert 'app_requests_retried_total{model_name="m",reason="queue_full"} 2.0' in text
    assert 'app_requests_retried_total{model_name="m",reason="engine_unavailable"} 1.0' in text


async def test_a_request_whose_engine_broke_under_it_on_two_replicas_is_held_back():
    broke = ServiceUnavailable("the engine failed while serving this request", retry_after_s=5)
    handle = StandInHandle(responses=[StandInResponse([Refused(broke, "r1", in_flight=True)]),
                                      StandInResponse([Refused(broke, "r2", in_flight=True)]),
                                      StandInResponse(ITEMS)])
    backend = HandleBackend(handle)
    poison = make_request("POISON")
    with pytest.raises(RequestQuarantined) as held:
        async for _ in backend.generate(poison):
            pass
    assert len(handle.calls) == 2 and held.value.code == "request_quarantined"  # not a third replica
    assert "on replica r2" in held.value.message
    with pytest.raises(RequestQuarantined, match="held back"):  # the SDK's retry: refused without a call
        async for _ in backend.generate(replace(poison, request_id="again")):
            pass
    assert len(handle.calls) == 2
    assert [item async for item in backend.generate(make_request("fine"))] == ITEMS


async def test_breaks_count_per_request_so_a_load_of_one_prompt_goes_on_through_engine_kills():
    broke = ServiceUnavailable("the engine failed while serving this request", retry_after_s=5)
    died = [StandInResponse([Refused(broke, f"r{i % 2}", in_flight=True)]) for i in range(3)]
    handle = StandInHandle(responses=[died[0], StandInResponse(ITEMS), died[1], StandInResponse(ITEMS), died[2],
                                      StandInResponse(ITEMS)])
    backend = fleet_of(HandleBackend(handle), "r0", "r1")
    for request_id in ("a", "b", "c"):  # the same prompt, each in a break of its own, each answered after it
        assert [item async for item in backend.generate(replace(make_request("same"), request_id=request_id))] == ITEMS
    assert len(handle.calls) == 6


async def test_refusals_on_arrival_hold_nothing_back():
    down = ServiceUnavailable("engine restarting", retry_after_s=5)
    handle = StandInHandle(responses=[StandInResponse([Refused(down, f"r{i}")]) for i in range(2)]
                           + [StandInResponse(ITEMS)])
    assert [item async for item in HandleBackend(handle).generate(make_request("hello"))] == ITEMS
    assert len(handle.calls) == 3


async def test_the_replica_says_whether_its_engine_broke_with_the_request_in_it():
    """`EngineReplica.generate_remote` marks a refusal `in_flight` only when the engine it sent the request to
    broke: what the ingress counts towards holding a request back."""
    from app.rayserve.replicas import EngineReplica

    replica = EngineReplica(make_config(engine={"fake_token_delay_s": 0.5}).models[0], ServiceConfig())
    try:
        answer = replica.generate_remote(make_request("hello"))
        task = asyncio.create_task(anext(answer))
        await until(lambda: replica.host.engine.stats().running == 1, what="the request in the engine")
        replica.host.engine.kill()
        refused = await asyncio.wait_for(task, 30)
        assert isinstance(refused, Refused) and isinstance(refused.error, ServiceUnavailable) and refused.in_flight
        await until(lambda: replica.host.supervisor.serving_engine() is None, what="the engine out of service")
        refused = await anext(replica.generate_remote(make_request("later")))
        assert isinstance(refused, Refused) and not refused.in_flight  # refused on arrival
    finally:
        replica.host.shutdown()
