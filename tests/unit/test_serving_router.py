"""The engine deployments' request router: its choice among replicas by their routing stats, and what an
`EngineHost` reports there."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import pytest

from app.engine.fake import FakeEngine
from app.host.engine_host import EngineHost
from app.rayserve.request_router import avoided, not_avoided, pick_two
from tests.support.fake_stack import make_config


@dataclass
class _Replica:
    name: str
    routing_stats: dict[str, Any] = field(default_factory=dict)


def _names(chosen: list[Any]) -> set[str]:
    return {r.name for r in chosen}


def test_a_replica_that_cannot_serve_is_never_chosen_while_another_can():
    dead, healthy = _Replica("dead", {"serving": False, "room": 12}), _Replica("ok", {"serving": True, "room": 0})
    for _ in range(50):
        assert _names(pick_two([dead, healthy])) == {"ok"}


def test_replicas_with_room_come_first_and_two_are_offered_when_they_can_be():
    full, roomy = [_Replica(f"full{i}", {"serving": True, "room": 0}) for i in range(3)], [
        _Replica(f"room{i}", {"serving": True, "room": 3}) for i in range(2)]
    for _ in range(50):
        assert _names(pick_two([*full, *roomy])) == {"room0", "room1"}


def test_without_stats_or_without_any_serving_replica_every_replica_is_a_candidate():
    fresh = [_Replica("a"), _Replica("b")]  # no stats polled yet: a new replica has loaded its engine
    assert _names(pick_two(fresh)) == {"a", "b"}
    down = [_Replica("a", {"serving": False}), _Replica("b", {"serving": False})]
    assert _names(pick_two(down)) == {"a", "b"}  # they answer 503 themselves rather than a request hanging


@pytest.mark.parametrize("dead", [False, True])
async def test_a_host_reports_whether_it_serves_and_its_room(dead):
    config = make_config(deployment={"max_ongoing_requests": 2, "max_queued_requests": 3})
    engine = FakeEngine()
    host = EngineHost(config.models[0], engine, config.service)
    ticket = host.admission.reserve()
    reported = host.routing_stats()
    assert {k: reported[k] for k in ("serving", "room", "in_system")} == {"serving": True, "room": 4, "in_system": 1}
    # Its prefix cache's shape, for the fleet router's estimate of it; no prediction before its pace is measured.
    assert (reported["block_tokens"], reported["cache_blocks"]) == (16, engine.kv_cache_tokens // 16)
    assert reported["wait_s"] is None and reported["prefill_s_per_token"] is None
    ticket.release()
    if dead:
        engine.kill()
        with pytest.raises(RuntimeError):
            await host.check_health()
        assert host.routing_stats()["serving"] is False
    else:
        assert (host.routing_stats()["serving"], host.routing_stats()["room"]) == (True, 5)


@dataclass(frozen=True)
class _Id:
    unique_id: str


@dataclass
class _Pending:
    args: list[Any]


def test_a_retried_request_leaves_out_the_replicas_that_refused_it_while_another_remains():
    a, b, c = (_Replica(n) for n in "abc")
    for r in (a, b, c):
        r.replica_id = _Id(r.name)  # type: ignore[attr-defined]
    retried = _Pending(["request", ("a", "b")])
    assert avoided(retried) == {"a", "b"}
    assert _names(not_avoided([a, b, c], avoided(retried))) == {"c"}
    assert _names(not_avoided([a, b], avoided(retried))) == {"a", "b"}  # every one refused: all stay candidates
    assert avoided(_Pending(["request"])) == frozenset() and avoided(None) == frozenset()


async def test_a_call_addressed_to_one_replica_goes_to_it_whatever_the_others_offer():
    """/metrics asks every replica (issue 27): a call whose first argument is `Addressed` goes to that replica,
    even one that cannot serve; to any when that replica has gone meanwhile (it answers with its own id)."""
    from app.rayserve.request_router import Addressed, ServingReplicaRouter

    a, b = _Replica("a", {"serving": True}), _Replica("b", {"serving": False})
    for r in (a, b):
        r.replica_id = _Id(r.name)  # type: ignore[attr-defined]
    router = ServingReplicaRouter.__new__(ServingReplicaRouter)  # choose_replicas reads none of its state here
    assert await router.choose_replicas([a, b], _Pending([Addressed("b")])) == [[b]]
    assert await router.choose_replicas([a, b], _Pending([Addressed("gone")])) == [[a, b]]


async def test_the_replica_chosen_for_a_call_is_the_one_that_call_gets_not_the_oldest_waiting_one():
    """Serve runs several routing tasks at once; each chooses for its own call. Serve's FIFO mixin hands the replica
    a task chose to the oldest call still waiting instead, so an address or a fleet ranking made for one call went to
    another: two concurrent /metrics calls addressed to two replicas could both reach one (the wedge test's scrape
    listed one replica in 2 of 7 CI runs). This router matches each choice to its own call."""
    from ray.serve._private.common import DeploymentHandleSource, DeploymentID, RequestMetadata
    from ray.serve.request_router import PendingRequest

    from app.rayserve.request_router import Addressed, ServingReplicaRouter

    router = ServingReplicaRouter(deployment_id=DeploymentID(name="engine", app_name="llm"),
                                  handle_source=DeploymentHandleSource.UNKNOWN, self_node_id="node")
    older = PendingRequest(args=[Addressed("x")], kwargs={}, metadata=RequestMetadata("older", "older"))
    newer = PendingRequest(args=[Addressed("y")], kwargs={}, metadata=RequestMetadata("newer", "newer"))
    for pending in (older, newer):  # as Serve queues a call for routing
        router._pending_requests_to_fulfill.append(pending)
        router._add_pending_request_to_indices(pending)
    router._fulfill_next_pending_request("replica y", newer.metadata)  # the task routing `newer` chose y
    assert newer.future.done() and newer.future.result() == "replica y"
    assert not older.future.done()
    # Calls sharing an id (made where Serve's context gave them one) are still each routed: the second as FIFO does.
    router._fulfill_next_pending_request("replica x", older.metadata)
    first, second = (PendingRequest(args=[], kwargs={}, metadata=RequestMetadata("r", "shared")) for _ in range(2))
    for pending in (first, second):
        router._pending_requests_to_fulfill.append(pending)
        router._add_pending_request_to_indices(pending)
    for replica in ("replica a", "replica b"):
        router._fulfill_next_pending_request(replica, second.metadata)
    assert (older.future.result(), first.future.result(), second.future.result()) == (
        "replica x", "replica a", "replica b")


async def test_calls_made_at_once_within_one_request_go_with_internal_ids_of_their_own(monkeypatch):
    """Serve gives a handle call the internal id of the request being handled; the router matches its choice to a
    call by that id, so the scrape's calls addressed to each replica (made at once) each need one of their own. The
    client's request id stays, and the request's own context is as it was after the calls."""
    from ray.serve import context as serve_context

    from app.rayserve import handle_backend
    from app.rayserve.request_router import Addressed

    seen: list[tuple[str, str]] = []

    class _Method:
        def remote(self, target: Addressed) -> Any:
            ctx = serve_context._get_serve_request_context()
            seen.append((ctx.request_id, ctx._internal_request_id))

            async def answer() -> tuple[str, Any]:
                await asyncio.sleep(0)
                return target.replica_id, {"replica": target.replica_id}
            return answer()

    class _Handle:
        stats_of = _Method()

        def options(self, **_options: Any) -> _Handle:
            return self

    monkeypatch.setattr(handle_backend, "replica_ids", lambda deployment: ["a", "b", "c"])
    serve_context._set_request_context(request_id="client-request", _internal_request_id="the-request")
    try:
        stats = await handle_backend.HandleBackend(_Handle()).replica_stats()  # type: ignore[arg-type]
        assert serve_context._get_serve_request_context()._internal_request_id == "the-request"
    finally:
        serve_context._unset_request_context()
    assert stats == {r: {"replica": r} for r in "abc"}
    assert [request_id for request_id, _ in seen] == ["client-request"] * 3
    assert len({internal for _, internal in seen} | {"the-request"}) == 4
