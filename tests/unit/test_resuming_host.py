"""A replica that serves HTTP itself keeps its requests through a broken engine (app/host/resuming_host.py): they
wait for the engine restarted in place and continue on it, the answer whole and as it would have been; a request
that arrives during the restart is refused at once; with no restart coming, in-flight requests end with the
retryable 503 as before."""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import replace

import pytest

from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.engine.interface import Admitted, EmbedRequest, GenerationDelta, PromptInput
from app.engine.quarantine import HOLD_S
from app.errors import RequestQuarantined, RequestTimeout, ServiceUnavailable
from app.host.resuming_host import ResumingHost
from app.host.supervisor import EngineState
from tests.support.fake_stack import make_config, make_request
from tests.support.waiting import until

DELAY_S = 0.01


class GatedStart(FakeEngine):
    """A restarted engine that loads until its gate opens, as a real one takes tens of seconds."""

    def __init__(self, gate: threading.Event):
        super().__init__(token_delay_s=DELAY_S)
        self.gate = gate

    def start(self) -> None:
        self.gate.wait(30)
        super().start()


def _host(factory=None) -> ResumingHost:
    return ResumingHost(make_config().models[0], FakeEngine(token_delay_s=DELAY_S), ServiceConfig(),
                        engine_factory=factory)


async def _answer(host: ResumingHost, request, kill_after: int | None = None) -> tuple[dict[int, str], dict, int]:
    """The texts by choice and finish reasons of `request`, the engine killed once `kill_after` tokens came."""
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    admitted, seen = 0, 0
    async for item in host.generate(request):
        if isinstance(item, Admitted):
            admitted += 1
            continue
        assert isinstance(item, GenerationDelta)
        for c in item.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            seen += c.num_tokens
            if c.finish_reason is not None:
                finishes[c.index] = c.finish_reason
        if kill_after is not None and seen >= kill_after:
            kill_after = None
            host.engine.kill()
    return texts, finishes, admitted


@pytest.mark.parametrize("n", [1, 2])
async def test_a_request_under_way_waits_for_the_restart_and_its_answer_is_whole(n: int):
    gate = threading.Event()
    host = _host(lambda: GatedStart(gate))
    request = make_request("tell me", max_tokens=40, n=n, seed=7, temperature=0)
    undisturbed = await _answer(_host(), request)

    task = asyncio.create_task(_answer(host, request, kill_after=5))
    await until(lambda: host.supervisor.state is EngineState.RESTARTING, what="the restart under way")
    assert not task.done()  # waiting for the new engine, not ended with a 503
    with pytest.raises(ServiceUnavailable, match="restarting"):  # a new request is refused at once
        await anext(host.generate(make_request("new")))
    gate.set()
    texts, finishes, admitted = await asyncio.wait_for(task, 30)
    assert (texts, finishes, admitted) == undisturbed and admitted == 1
    assert host.migrated["resumed"] == n and host.supervisor.restarts_total == 1


async def test_a_request_that_had_no_answer_yet_is_sent_again_on_the_new_engine():
    gate = threading.Event()
    host = ResumingHost(make_config().models[0], FakeEngine(prefill_s_per_token=0.02), ServiceConfig(),
                        engine_factory=lambda: GatedStart(gate))
    task = asyncio.create_task(_answer(host, make_request("a prompt of some length", max_tokens=8)))
    await until(lambda: host.engine.stats().running == 1, what="the request in its prefill")
    host.engine.kill()  # dies before the request's first token
    await until(lambda: host.supervisor.state is EngineState.RESTARTING, what="the restart under way")
    gate.set()
    texts, finishes, admitted = await asyncio.wait_for(task, 30)
    assert len(texts[0].split()) == 8 and finishes == {0: "length"} and admitted == 1
    assert host.migrated["resumed"] == 0  # sent again whole, not continued


async def test_without_a_restart_the_request_ends_with_the_retryable_503():
    host = _host()  # no factory: the broken engine is Serve's to replace
    with pytest.raises(ServiceUnavailable):
        await _answer(host, make_request("x", max_tokens=40), kill_after=3)
    assert host.supervisor.state is EngineState.BROKEN and host.migrated["resumed"] == 0


async def test_a_request_whose_time_runs_out_during_the_restart_is_a_timeout():
    gate = threading.Event()
    host = _host(lambda: GatedStart(gate))
    try:
        with pytest.raises(RequestTimeout, match="while its engine restarted"):
            await asyncio.wait_for(_answer(host, make_request("x", max_tokens=200, timeout_s=1.0), kill_after=3), 30)
    finally:
        gate.set()


async def test_a_client_gone_while_it_waits_leaves_nothing_behind():
    gate = threading.Event()
    host = _host(lambda: GatedStart(gate))
    task = asyncio.create_task(_answer(host, make_request("x", max_tokens=40), kill_after=3))
    await until(lambda: host.supervisor.state is EngineState.RESTARTING, what="the restart under way")
    task.cancel()  # what the ingress does when the client hangs up
    with pytest.raises(asyncio.CancelledError):
        await task
    gate.set()
    await until(lambda: host.supervisor.state is EngineState.SERVING, what="restarted")
    assert host.admission.stats().in_system == 0 and host.engine.stats().running == 0
    assert host.migrated["resumed"] == 0


async def test_an_embeddings_request_under_way_is_answered_by_the_restarted_engine():
    gate = threading.Event()
    config = make_config(runner="embed").models[0]
    host = ResumingHost(config, FakeEngine(token_delay_s=0.5), ServiceConfig(), engine_factory=lambda: GatedStart(gate))
    request = EmbedRequest(request_id=f"embd-{uuid.uuid4().hex}", timeout_s=30,
                           inputs=(PromptInput(text="one", param="input"), PromptInput(text="two", param="input")))
    undisturbed = await ResumingHost(config, FakeEngine(), ServiceConfig()).embed(request)

    task = asyncio.create_task(host.embed(request))
    await until(lambda: host.engine.stats().running == 2, what="both inputs in the engine")
    host.engine.kill()
    await until(lambda: host.supervisor.state is EngineState.RESTARTING, what="the restart under way")
    assert not task.done()  # waiting for the new engine, not ended with a 503
    gate.set()
    assert await asyncio.wait_for(task, 30) == undisturbed
    assert host.supervisor.restarts_total == 1 and host.admission.stats().in_system == 0


class Poisoned(FakeEngine):
    """Dies whenever a prompt holding POISON reaches it, before any output: a request some kernel crashes on."""

    async def generate(self, request_id, prompt_token_ids, params):
        if b"POISON" in bytes(prompt_token_ids):
            self.kill()
        async for delta in super().generate(request_id, prompt_token_ids, params):
            yield delta


async def test_a_request_that_breaks_the_engine_twice_before_its_first_output_is_held_back():
    host = ResumingHost(make_config().models[0], Poisoned(), ServiceConfig(), engine_factory=Poisoned)
    poison = make_request("POISON pill", max_tokens=8)
    with pytest.raises(RequestQuarantined) as held:
        await asyncio.wait_for(_answer(host, poison), 30)
    assert held.value.status == 503 and held.value.code == "request_quarantined"
    await until(lambda: host.supervisor.state is EngineState.SERVING, what="the second restart done")
    assert host.supervisor.restarts_total == 2  # not a third: that one would have left the replica to Serve
    # The same request sent again (the SDK retries a 503) is refused at once, its engine untouched.
    with pytest.raises(RequestQuarantined, match="held back") as again:
        await _answer(host, replace(poison, request_id="again"))
    assert 1 <= again.value.retry_after_s <= HOLD_S and host.supervisor.restarts_total == 2
    texts, finishes, _ = await asyncio.wait_for(_answer(host, make_request("a fine one", max_tokens=4)), 30)
    assert finishes == {0: "length"} and len(texts[0].split()) == 4  # others are served meanwhile


POISON_LATER = "POISON later"


class PoisonedLater(FakeEngine):
    """Dies when a prompt starting with POISON has had 3 outputs, and at once when its continuation (the prompt and
    its output so far) arrives: a request some kernel crashes on only at some length of context."""

    async def generate(self, request_id, prompt_token_ids, params):
        poisoned = list(prompt_token_ids[:6]) == list(b"POISON")
        if poisoned and len(prompt_token_ids) > len(POISON_LATER):
            self.kill()
        produced = 0
        async for delta in super().generate(request_id, prompt_token_ids, params):
            yield delta
            produced += 1
            if poisoned and produced == 3:
                self.kill()


async def test_a_request_that_breaks_the_engine_after_its_first_output_and_again_continued_is_held_back():
    host = ResumingHost(make_config().models[0], PoisonedLater(), ServiceConfig(), engine_factory=PoisonedLater)
    poison = make_request(POISON_LATER, max_tokens=8)
    with pytest.raises(RequestQuarantined, match="failed 2 times"):
        await asyncio.wait_for(_answer(host, poison), 30)
    await until(lambda: host.supervisor.state is EngineState.SERVING, what="the second restart done")
    assert host.supervisor.restarts_total == 2  # not a third: that one would have left the replica to Serve
    with pytest.raises(RequestQuarantined, match="held back"):  # the whole request sent again: refused at once
        await _answer(host, replace(poison, request_id="again"))
    assert host.supervisor.restarts_total == 2
    texts, finishes, _ = await asyncio.wait_for(_answer(host, make_request("a fine one", max_tokens=4)), 30)
    assert finishes == {0: "length"} and len(texts[0].split()) == 4


async def test_identical_requests_in_one_break_count_it_once_and_both_go_on():
    gate = threading.Event()
    host = ResumingHost(make_config().models[0], FakeEngine(prefill_s_per_token=0.02), ServiceConfig(),
                        engine_factory=lambda: GatedStart(gate))
    same = make_request("a prompt of some length", max_tokens=8)
    tasks = [asyncio.create_task(_answer(host, replace(same, request_id=f"r{i}"))) for i in range(2)]
    await until(lambda: host.engine.stats().running == 2, what="both in their prefill")
    host.engine.kill()
    await until(lambda: host.supervisor.state is EngineState.RESTARTING, what="the restart under way")
    gate.set()
    for texts, finishes, _ in await asyncio.wait_for(asyncio.gather(*tasks), 30):
        assert finishes == {0: "length"} and len(texts[0].split()) == 8
