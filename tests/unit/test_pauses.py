"""A running request gives its slot to another tenant's and resumes in place (app/host/slots.py, app/host/pauses.py):
who is asked to yield, and that the paused request's answer is the one it would have had undisturbed."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.engine.interface import Admitted, GenerateRequest, GenerationDelta, GenerationParams
from app.host.admission import Admission
from app.host.engine_host import EngineHost
from app.host.fair_queue import FairQueue
from app.host.pauses import pausable
from app.host.ticket import Ticket
from app.tenancy import Tenant
from tests.support.fake_stack import MAX_MODEL_LEN, make_config, make_request
from tests.support.waiting import until

A, B = Tenant("a"), Tenant("b")
BATCH = Tenant("bulk", batch=True)


def admission(max_running: int) -> Admission:
    return Admission(max_running=max_running, max_queued=8, token_budget=10_000, queue_timeout_s=30)


async def running(adm: Admission, tenant: Tenant) -> Ticket:
    ticket = adm.reserve(tenant)
    ticket.pausable = True
    await ticket.admit(30, 30, prompt_tokens=10, max_steps=20)
    ticket.produced(1)
    return ticket


def waiting(adm: Admission, tenant: Tenant) -> tuple[Ticket, asyncio.Task]:
    ticket = adm.reserve(tenant)
    return ticket, asyncio.create_task(ticket.admit(30, 30, prompt_tokens=10, max_steps=20))


async def test_the_newest_request_of_the_tenant_holding_the_most_slots_yields_to_another_tenant_s():
    adm = admission(max_running=2)
    first, newest = await running(adm, A), await running(adm, A)
    light, admitted = waiting(adm, B)
    await until(lambda: newest.yield_asked, what="A's newest asked to yield")
    assert not first.yield_asked
    paused = asyncio.create_task(newest.pause(30))
    await admitted  # B runs in the slot A's request gave back
    assert light.state == "running" and newest.state == "waiting" and newest.paused
    assert adm.stats().running == 2 and adm.stats().in_system == 3
    light.release(completed=True)
    await paused  # first of A's again: it resumes before anything newer
    assert newest.state == "running" and newest.resuming and not newest.yield_asked
    for t in (first, newest):
        t.release()
    assert adm.stats().in_system == 0


async def test_one_tenant_never_pauses_itself_and_an_even_split_stays():
    adm = admission(max_running=2)
    mine = [await running(adm, A), await running(adm, A)]
    _, own = waiting(adm, A)
    await asyncio.sleep(0)
    assert not any(t.yield_asked for t in mine)  # first come, first served, as before
    _, light = waiting(adm, B)  # A holds 2 of 2 slots, B none: one of A's is asked
    await until(lambda: mine[1].yield_asked, what="A's newest asked")
    paused = asyncio.create_task(mine[1].pause(30))
    await light
    _, more = waiting(adm, B)  # 1 and 1: even, nobody else is asked
    await asyncio.sleep(0)
    assert not mine[0].yield_asked
    for task in (own, paused, more):
        task.cancel()


async def test_a_tenant_holding_more_slots_but_served_less_keeps_them_until_it_has_been_served_as_much():
    """s4 of docs/tenants.md: long streams of A against B's long prompts. B, already served more, waits for a slot
    instead of taking one of A's; once A's outputs make it the more served, one of A's is asked to yield."""
    adm = admission(max_running=4)
    streams = [await running(adm, A) for _ in range(3)]  # A served 3 x (10 + 2)
    heavy = adm.reserve(B)
    await heavy.admit(1020, 30, prompt_tokens=1000, max_steps=20)  # B level with A at 36 on arrival, then 1036
    heavy.produced(1)  # 1038; every slot held, three of them by A
    _, task = waiting(adm, B)
    await asyncio.sleep(0)
    assert not any(t.yield_asked for t in streams) and not task.done()
    streams[0].produced(500)  # A served 1036: still less
    assert not any(t.yield_asked for t in streams)
    streams[0].produced(1)  # A served 1038: as much as B
    assert sum(t.yield_asked for t in streams) == 1
    task.cancel()


async def test_an_interactive_request_takes_a_slot_from_a_batch_one_even_when_it_holds_as_many():
    adm = admission(max_running=1)
    bulk = await running(adm, BATCH)
    waiting(adm, A)
    await until(lambda: bulk.yield_asked, what="the batch request asked to yield")


async def test_a_request_that_cannot_pause_keeps_its_slot():
    adm = admission(max_running=1)
    hog = await running(adm, A)
    hog.pausable = False
    _, task = waiting(adm, B)
    await asyncio.sleep(0)
    assert not hog.yield_asked and not task.done()
    hog.release()
    await task


def test_a_paused_request_is_never_the_one_displaced_from_a_full_queue():
    class Item:
        def __init__(self, tenant: Tenant, paused: bool = False):
            self.tenant, self.prompt_tokens, self.tokens, self.paused = tenant, 10, 30, paused

    q: FairQueue[Item] = FairQueue()
    paused = Item(A, paused=True)
    for _ in range(3):
        q.entered(A)
    q.push_front(paused)
    assert q.over_share(B) is None  # A's only waiting request is mid-answer
    newer = Item(A)
    q.append(newer)
    assert q.over_share(B) is newer and q.head() is paused


# -- on the host, over the fake engine ----------------------------------------------------------------------------


def two_slot_host(engine: FakeEngine) -> EngineHost:
    """Two slots; the engine's request ids recorded in `engine.seen_ids`."""
    seen: list[str] = []
    generate = engine.generate

    def spying(request_id, *args, **kwargs):
        seen.append(request_id)
        return generate(request_id, *args, **kwargs)
    engine.generate = spying  # type: ignore[method-assign]
    engine.seen_ids = seen  # type: ignore[attr-defined]
    config = make_config(deployment={"max_ongoing_requests": 2, "max_queued_requests": 4, "queue_timeout_s": 30})
    return EngineHost(config.models[0], engine, ServiceConfig())


async def answer(host: EngineHost, request: GenerateRequest) -> tuple[str, list[GenerationDelta]]:
    items = [item async for item in host.generate(request)]
    assert isinstance(items[0], Admitted)
    deltas = [i for i in items[1:] if isinstance(i, GenerationDelta)]
    return "".join(c.text for d in deltas for c in d.choices), deltas


async def started(host: EngineHost, request: GenerateRequest) -> asyncio.Task:
    """`request` streaming, its first output had; the rest read by a task (a reader that keeps reading)."""
    stream = host.generate(request)
    assert isinstance(await anext(stream), Admitted)
    first = await anext(stream)

    async def the_rest() -> list[GenerationDelta]:
        return [first, *[item async for item in stream]]
    return asyncio.create_task(the_rest())


async def paused_for_another_tenant(host: EngineHost, heavy: list[GenerateRequest]
                                    ) -> list[tuple[str, list[GenerationDelta]]]:
    """`heavy` (tenant A's two requests) stream in both slots; B's short request arrives and is answered while
    A's stream on."""
    streams = [await started(host, r) for r in heavy]
    light_text, _ = await answer(host, replace(make_request("hi", max_tokens=3), tenant=B))
    assert light_text and not any(s.done() for s in streams), "B was answered only after A's streams ended"
    answers = [await s for s in streams]
    return [("".join(c.text for d in deltas for c in d.choices), deltas) for deltas in answers]


async def test_a_greedy_stream_paused_for_another_tenant_gives_its_undisturbed_answer():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.005)
    host = two_slot_host(engine)
    params = {"max_tokens": 40, "ignore_eos": True, "temperature": 0.0}
    alone, _ = await answer(host, replace(make_request("a long story", **params), tenant=A))
    heavy = [replace(make_request("a long story", **params), tenant=A) for _ in range(2)]
    answers = await paused_for_another_tenant(host, heavy)
    for text, deltas in answers:
        assert text == alone
        assert sum(c.num_tokens for d in deltas for c in d.choices) == 40
        assert [c.finish_reason for d in deltas for c in d.choices if c.finish_reason] == ["length"]
        assert all(d.choices[0].token_ids is None and d.prompt_token_ids is None for d in deltas)  # not asked for
    newest = heavy[1].request_id
    assert engine.aborted == [newest] and f"{newest}-resume1-0" in engine.seen_ids  # type: ignore[attr-defined]
    assert host.admission.stats().in_system == 0


async def test_a_seeded_sampled_stream_paused_gives_its_undisturbed_answer():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.005)
    host = two_slot_host(engine)
    params = {"max_tokens": 30, "ignore_eos": True, "temperature": 0.9, "seed": 11}
    alone, _ = await answer(host, replace(make_request("tell me", **params), tenant=A))
    answers = await paused_for_another_tenant(host, [replace(make_request("tell me", **params), tenant=A)
                                                     for _ in range(2)])
    assert [text for text, _ in answers] == [alone, alone]
    assert len(engine.aborted) == 1


@pytest.mark.parametrize("stop", [(), ("w30 w31", "never said")], ids=["no stop", "a stop string after the pause"])
async def test_a_tool_choice_auto_stream_paused_gives_its_calls_once(stop):
    """The resumed request's tool-call parser reads again what the first had read (engine/vllm/tool_parsing.py;
    the fake engine's stand-in finds its call in the first piece it reads): the call is not made twice. Its stop
    strings, matched before the parser, read it again too: the answer ends where it would have."""
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.005)
    host = two_slot_host(engine)
    tool = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
    params = {"max_tokens": 40, "ignore_eos": True, "temperature": 0.0, "auto_tools": (tool,), "stop": stop}
    alone, alone_deltas = await answer(host, replace(make_request("a long story", **params), tenant=A))
    assert alone.endswith("w29 ") == bool(stop)
    calls = [(t.index, t.name, t.arguments) for d in alone_deltas for c in d.choices for t in c.tool_calls]
    assert [name for _, name, _ in calls] == ["get_weather"]
    heavy = [replace(make_request("a long story", **params), tenant=A) for _ in range(2)]
    for text, deltas in await paused_for_another_tenant(host, heavy):
        assert text == alone
        assert [(t.index, t.name, t.arguments) for d in deltas for c in d.choices for t in c.tool_calls] == calls
    assert engine.aborted == [heavy[1].request_id]
    assert host.admission.stats().in_system == 0


async def test_a_stream_with_a_stop_string_paused_for_another_tenant_ends_where_it_would_have():
    """The stop string is matched over the whole choice (the engine asked to include it, so it holds no text back);
    it spans two tokens and comes well after the pause."""
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.005)
    host = two_slot_host(engine)
    params = {"max_tokens": 40, "ignore_eos": True, "temperature": 0.0, "stop": ["w30 w31", "never said"]}
    alone, alone_deltas = await answer(host, replace(make_request("a long story", **params), tenant=A))
    assert alone.endswith("w29 ") and "w30" not in alone
    heavy = [replace(make_request("a long story", **params), tenant=A) for _ in range(2)]
    answers = await paused_for_another_tenant(host, heavy)
    for text, deltas in answers:
        assert text == alone
        assert [(c.finish_reason, c.stop_reason) for d in deltas for c in d.choices if c.finish_reason] == [
            ("stop", "w30 w31")]
    assert engine.aborted == [heavy[1].request_id]  # the newest paused once, and was not cut short
    assert host.admission.stats().in_system == 0


async def test_stop_strings_the_engine_does_not_stop_on_itself_are_not_paused():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.005)
    host = two_slot_host(engine)
    # With stop token ids the engine is not given the stop strings (a stop token's text would be kept), so after a
    # match here it would run on unread: such a stream keeps its slot and the other tenant waits for one.
    heavy = [replace(make_request("a long story", max_tokens=20, ignore_eos=True, stop=["never-said"],
                                  stop_token_ids=(7,)), tenant=A) for _ in range(2)]
    streams = [await started(host, r) for r in heavy]
    light = asyncio.create_task(answer(host, replace(make_request("hi", max_tokens=3), tenant=B)))
    await asyncio.wait([light, *streams], return_when=asyncio.FIRST_COMPLETED)
    assert not light.done()  # it waited for a slot
    await asyncio.gather(light, *streams)
    assert engine.aborted == []


# -- a client that stops reading ------------------------------------------------------------------------------------


class Client:
    """The connection's delivery clock as the host sees it (app/engine/client.py)."""

    def __init__(self) -> None:
        self.stalled = 0.0

    def stalled_s(self) -> float:
        return self.stalled


def one_slot_host(engine: FakeEngine) -> EngineHost:
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 4, "queue_timeout_s": 30})
    return EngineHost(config.models[0], engine, ServiceConfig())


def texts(deltas: list[GenerationDelta], n: int) -> list[str]:
    return ["".join(c.text for d in deltas for c in d.choices if c.index == i) for i in range(n)]


async def test_a_stream_whose_client_stops_reading_leaves_the_engine_and_resumes_when_it_reads_again():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.005)
    host = one_slot_host(engine)
    params = {"max_tokens": 40, "ignore_eos": True, "temperature": 0.8, "seed": 5, "n": 2}
    _, alone = await answer(host, make_request("a long story", **params))
    client, slow = Client(), make_request("a long story", **params)
    stream = host.generate(slow, client)
    assert isinstance(await anext(stream), Admitted)
    first = await anext(stream)
    client.stalled = 10.0  # it stops reading: at its next output the request gives its slot back
    other, _ = await answer(host, make_request("hi", max_tokens=3))  # and another runs in it meanwhile
    assert other and slow.request_id in engine.aborted
    stats = host.admission.stats()
    # Out of the engine and of the count of places (its tenant still charged for it): it costs a connection.
    assert (stats.running, stats.waiting, stats.in_system, stats.aside) == (0, 0, 0, 1)
    client.stalled = 0.0  # it reads again: what it was sent, then the rest, resumed per choice
    rest = [item async for item in stream]
    deltas = [first, *rest]
    assert texts(deltas, 2) == texts(alone, 2)
    assert [c.finish_reason for d in deltas for c in d.choices if c.finish_reason] == ["length", "length"]
    assert host.admission.stats().in_system == 0


async def test_a_client_gone_while_its_stream_is_out_of_the_engine_frees_its_place():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.005)
    host = one_slot_host(engine)
    client, slow = Client(), make_request("a long story", max_tokens=60, ignore_eos=True)
    stream = host.generate(slow, client)
    assert isinstance(await anext(stream), Admitted)
    await anext(stream)
    client.stalled = 10.0
    await until(lambda: host.admission.stats().aside == 1, what="the stream out of the engine")
    await stream.aclose()  # the write-stall clock cut the connection
    stats = host.admission.stats()
    assert (stats.in_system, stats.aside) == (0, 0) and not engine.running


def test_what_can_pause_is_what_resumes_from_its_tokens_alone():
    for resumes in ({}, {"presence_penalty": 1.0, "frequency_penalty": 0.5}, {"bad_words": ("x",)},
                    {"json_schema": {"type": "object"}}, {"regex": "[a-z]+"}):
        assert pausable(GenerationParams(max_tokens=8, **resumes)), resumes
    assert pausable(GenerationParams(max_tokens=8, stop=("end",)))  # matched over the whole choice
    assert not pausable(GenerationParams(max_tokens=8, stop=("end",), stop_token_ids=(2,)))
    assert not pausable(GenerationParams(max_tokens=8, stop=("end",), skip_special_tokens=False))
    auto = ({"type": "function", "function": {"name": "f"}},)
    assert pausable(GenerationParams(max_tokens=8, auto_tools=auto))  # its parser reads again what it had read
    assert pausable(GenerationParams(max_tokens=8, auto_tools=auto, stop=("end",)))  # matched before the parser
