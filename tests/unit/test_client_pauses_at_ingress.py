"""Behind a separate ingress (app/rayserve/client_pauses.py): a stream whose client stops reading is taken out of the
engine by the ingress, which holds the connection, and continued on a replica once the client reads again; the
client sees the answer it would have had undisturbed. Driven through `HandleBackend` over in-process replicas."""

from __future__ import annotations

from app.engine.interface import Admitted, GenerationDelta
from tests.support.fake_fleet import FakeFleet
from tests.support.fake_stack import make_request
from tests.support.waiting import until


class Client:
    """The connection's delivery clock as the ingress sees it (app/engine/client.py)."""

    def __init__(self) -> None:
        self.stalled = 0.0

    def stalled_s(self) -> float:
        return self.stalled


def texts(deltas: list, n: int) -> list[str]:
    return ["".join(c.text for d in deltas if isinstance(d, GenerationDelta) for c in d.choices if c.index == i)
            for i in range(n)]


def idle(fleet: FakeFleet) -> bool:
    return all(not e.running for e in fleet.engines.values()) and all(
        h.admission.stats().in_system == 0 for h in fleet.hosts.values())


async def test_a_stream_whose_client_stops_reading_leaves_the_engine_and_ends_whole_when_it_reads_again():
    fleet = FakeFleet(replicas=2, engine={"token_delay_s": 0.005})
    params = {"max_tokens": 40, "ignore_eos": True, "temperature": 0.8, "seed": 5, "n": 2}
    alone = [item async for item in fleet.backend.generate(make_request("a long story", **params))]
    client, slow = Client(), make_request("a long story", **params)
    stream = fleet.backend.generate(slow, client)
    assert isinstance(await anext(stream), Admitted)
    first = await anext(stream)
    client.stalled = 10.0  # it stops reading: at the next output the ingress closes the engine's stream
    await until(lambda: fleet.backend.migrated["paused"] == 1 and idle(fleet), what="the stream out of the engine")
    assert any(slow.request_id in e.aborted for e in fleet.engines.values())
    client.stalled = 0.0  # it reads again: what it was sent, then the rest, resumed per choice
    deltas = [first, *[item async for item in stream]]
    assert texts(deltas, 2) == texts(alone, 2) and all(texts(deltas, 2))
    choices = [c for d in deltas if isinstance(d, GenerationDelta) for c in d.choices]
    assert [c.finish_reason for c in choices if c.finish_reason] == ["length", "length"]
    assert [sum(c.num_tokens for c in choices if c.index == i) for i in (0, 1)] == [40, 40]  # usage: as generated
    assert all(c.token_ids is None for c in choices)  # the ids the resume needed were not asked for by the client
    assert not any(isinstance(d, Admitted) for d in deltas)  # one Admitted only: the first, above
    await until(lambda: idle(fleet), what="every replica idle")


async def test_a_stream_with_a_stop_string_paused_at_the_ingress_ends_where_it_would_have():
    fleet = FakeFleet(replicas=2, engine={"token_delay_s": 0.005})
    params = {"max_tokens": 40, "ignore_eos": True, "temperature": 0.0, "stop": ["w30 w31"]}
    alone = [item async for item in fleet.backend.generate(make_request("a long story", **params))]
    client, slow = Client(), make_request("a long story", **params)
    stream = fleet.backend.generate(slow, client)
    assert isinstance(await anext(stream), Admitted)
    first = await anext(stream)
    client.stalled = 10.0
    await until(lambda: fleet.backend.migrated["paused"] == 1 and idle(fleet), what="the stream out of the engine")
    client.stalled = 0.0
    deltas = [first, *[item async for item in stream]]
    assert texts(deltas, 1) == texts(alone, 1) and texts(deltas, 1)[0].endswith("w29 ")
    choices = [c for d in deltas if isinstance(d, GenerationDelta) for c in d.choices]
    assert [(c.finish_reason, c.stop_reason) for c in choices if c.finish_reason] == [("stop", "w30 w31")]
    await until(lambda: idle(fleet), what="every replica idle")


async def test_a_stream_that_cannot_pause_runs_to_its_end_whatever_its_client_does():
    fleet = FakeFleet(replicas=2, engine={"token_delay_s": 0.002})
    client = Client()
    # Stop strings with special tokens kept: the engine does not stop on them itself (app/engine/continuation.py).
    stream = fleet.backend.generate(make_request("a long story", max_tokens=30, ignore_eos=True,
                                                 stop=["never-said"], skip_special_tokens=False), client)
    assert isinstance(await anext(stream), Admitted)
    client.stalled = 10.0
    rest = [item async for item in stream]
    assert sum(c.num_tokens for d in rest if isinstance(d, GenerationDelta) for c in d.choices) == 30
    assert fleet.backend.migrated["paused"] == 0 and all(not e.aborted for e in fleet.engines.values())


async def test_a_client_gone_while_its_stream_is_out_of_the_engine_leaves_nothing_behind():
    fleet = FakeFleet(replicas=2, engine={"token_delay_s": 0.005})
    client = Client()
    stream = fleet.backend.generate(make_request("a long story", max_tokens=60, ignore_eos=True), client)
    assert isinstance(await anext(stream), Admitted)
    await anext(stream)
    client.stalled = 10.0
    await until(lambda: fleet.backend.migrated["paused"] == 1, what="the stream out of the engine")
    await stream.aclose()  # the write-stall clock cut the connection
    await until(lambda: idle(fleet), what="every replica idle")
    assert sum(len(e.aborted) for e in fleet.engines.values()) == 1  # the one engine request, not a resumed one
