"""An engine that stops making progress (vLLM's EngineCore under SIGSTOP passes vLLM's own health check for
ever) is found by `EngineHost`'s progress watch within the bound and not before; a busy engine (32 prompts at
the full context) and a slow one are never flagged; the wedged engine's requests end retryable; and with an
`engine_factory` the host restarts its engine in place, refusing with 503 + Retry-After meanwhile.

`SteppedEngine` is vLLM's scheduling in time: one step at a time, each emitting a token for every request
past its prefill and prefilling up to `step_tokens` of the waiting prompts in arrival order, lasting its
prefill tokens at `prefill_tokens_per_s` plus `decode_step_s`. `stop()` is the SIGSTOP: no step runs."""

from __future__ import annotations

import asyncio
import subprocess
import threading
import time
from dataclasses import dataclass, field

import httpx
import psutil
import pytest

from app.config.service import ServiceConfig
from app.engine.engine_stats import EngineStats
from app.engine.fake import FakeEngine
from app.engine.interface import Admitted, ChoiceDelta, EngineDead, GenerationDelta
from app.engine.processes import EngineProcesses
from app.errors import EngineWedged, ServiceUnavailable
from app.host.engine_host import EngineHost
from app.host.progress_watch import ProgressWatch
from app.host.restart_budget import RESTART_LIMIT
from app.http.ingress import create_app
from app.http.metrics import Metrics
from tests.support import sse
from tests.support.fake_stack import MODEL_ID, chat_body, make_config, make_request
from tests.support.waiting import until

FULL_CONTEXT = 2048  # configs/cpu.yaml's max_model_len
STEP_TOKENS = 2048  # vLLM 0.32's max_num_batched_tokens on a CPU (its start-up log says so)
PREFILL_TOKENS_PER_S = 20_000.0  # so a 2040-token prompt takes ~0.1 s, and 32 of them ~3.3 s
FLOOR_S = 0.5  # the test's floor (production: 30 s), small beside the 32 prompts' 3.3 s of prefill
MARGIN = 2.0


@dataclass
class SamplingRequest:
    prefill_left: int
    max_tokens: int
    emitted: int = 0
    ready: asyncio.Queue[None] = field(default_factory=asyncio.Queue)


class SteppedEngine(FakeEngine):
    def __init__(self, prefill_tokens_per_s: float = PREFILL_TOKENS_PER_S, decode_step_s: float = 0.002,
                 step_tokens: int = STEP_TOKENS, start_blocks: threading.Event | None = None,
                 start_fails: bool = False, stop_after_tokens: int | None = None):
        super().__init__(max_model_len=FULL_CONTEXT)
        self.prefill_tokens_per_s = prefill_tokens_per_s
        self.decode_step_s = decode_step_s
        self.step_tokens = step_tokens
        self.start_blocks = start_blocks
        self.start_fails = start_fails
        self.stop_after_tokens = stop_after_tokens  # stop() once this many tokens have been emitted
        self.shut_down = False
        self.stopped = False
        self.last_emit = 0.0  # time.monotonic() of the last token emitted
        self._requests: dict[str, SamplingRequest] = {}
        self._stepping: asyncio.Task[None] | None = None
        # The next step waits until this many requests are in (then back to 1): concurrent requests reach the engine
        # over a few turns of the loop (the tokenizer thread, the host's relay), and the worst case wants them in one
        # step.
        self.gather = 1

    def start(self) -> None:
        if self.start_blocks is not None:
            self.start_blocks.wait(30)
        if self.start_fails:
            raise RuntimeError("weights missing")
        super().start()

    def stop(self) -> None:
        """SIGSTOP: the step under way and every later one wait for ever."""
        self.stopped = True

    def shutdown(self) -> None:
        self.shut_down = True
        super().shutdown()

    def kill(self) -> None:
        """The EngineCore killed: every request in it ends with EngineDead, as vLLM's do."""
        super().kill()
        for request in self._requests.values():
            request.ready.put_nowait(None)

    async def generate(self, request_id, prompt_token_ids, params):
        if self.dead:
            raise EngineDead("stepped engine is dead")
        request = SamplingRequest(prefill_left=len(prompt_token_ids), max_tokens=params.max_tokens)
        self._requests[request_id] = request
        self.running.add(request_id)
        self._prompted += len(prompt_token_ids)
        if self._stepping is None or self._stepping.done():
            self._stepping = asyncio.get_running_loop().create_task(self._steps())
        self._changed()
        try:
            for i in range(params.max_tokens):
                await request.ready.get()
                if self.dead:
                    raise EngineDead("stepped engine died mid-request")
                finish = "length" if i + 1 == params.max_tokens else None
                choice = ChoiceDelta(index=0, text=f"w{i} ", num_tokens=1, finish_reason=finish)
                yield GenerationDelta(choices=(choice,))
        finally:
            self._requests.pop(request_id, None)
            self.running.discard(request_id)
            self._changed()

    async def _steps(self) -> None:
        while self._requests:
            if len(self._requests) < self.gather:  # the next step waits for all of them (see `gather`)
                await asyncio.sleep(0.001)
                continue
            self.gather = 1
            unfinished = [r for r in self._requests.values() if r.emitted < r.max_tokens]
            decoding = [r for r in unfinished if r.prefill_left == 0]
            budget, prefilled, completed = self.step_tokens, 0, []
            for r in unfinished:
                if r.prefill_left and budget:
                    take = min(budget, r.prefill_left)
                    r.prefill_left -= take
                    budget -= take
                    prefilled += take
                    if not r.prefill_left:
                        completed.append(r)
            await asyncio.sleep(prefilled / self.prefill_tokens_per_s + self.decode_step_s)  # the step's compute
            while self.stopped:
                await asyncio.sleep(3600)  # stopped: no progress, ever (the task is cancelled with the loop)
            for r in decoding + completed:
                r.emitted += 1
                r.ready.put_nowait(None)
                self._generated += 1
                self.last_emit = time.monotonic()
            if self.stop_after_tokens is not None and self._generated >= self.stop_after_tokens:
                self.stop()
            if not decoding and not completed and not prefilled:
                await asyncio.sleep(0.001)  # everything emitted, waiting for its readers

    def stats(self) -> EngineStats:
        unfinished = sum(1 for r in self._requests.values() if r.emitted < r.max_tokens)  # as vLLM counts them
        return EngineStats(running=unfinished, prompt_tokens_total=self._prompted,
                           generation_tokens_total=self._generated)


def _config(**deployment):
    return make_config(
        engine={"max_model_len": FULL_CONTEXT},
        deployment={"max_ongoing_requests": 32, "max_queued_requests": 64, "queue_timeout_s": 60, **deployment},
        limits={"max_tokens": 64, "default_max_tokens": 8},
    )


def _watch() -> ProgressWatch:
    return ProgressWatch(floor_s=FLOOR_S, margin=MARGIN)


def _host(engine: SteppedEngine, factory=None) -> EngineHost:
    return EngineHost(_config().models[0], engine, ServiceConfig(), engine_factory=factory, progress_watch=_watch())


def _prompt(tokens: int) -> str:
    return "x" * tokens  # the fake engine's tokens are bytes


async def _run(host: EngineHost, tokens: int, max_tokens: int = 8) -> tuple[float, int]:
    """One request to its end: (seconds to its first output, tokens)."""
    started, first, count = time.monotonic(), None, 0
    async for item in host.generate(make_request(_prompt(tokens), max_tokens=max_tokens, ignore_eos=True,
                                                 timeout_s=120)):
        if not isinstance(item, Admitted):
            first = first or time.monotonic() - started
            count += sum(c.num_tokens for c in item.choices)
    assert first is not None
    return first, count


async def _measure_pace_at(host: EngineHost, expected: float) -> float:
    """Requests one at a time, so the host's pace measures the engine's prefill rate; returns that rate."""
    for tokens in (200, 600, 1000, 1400, 1800, 2040):
        await _run(host, tokens)
    rate = (await host.stats()).pace.prefill_tokens_per_s
    assert rate is not None and rate == pytest.approx(expected, rel=0.2)
    return rate


async def _measure_pace(host: EngineHost) -> float:
    return await _measure_pace_at(host, PREFILL_TOKENS_PER_S)


@pytest.mark.parametrize("step_tokens", [STEP_TOKENS, 32 * FULL_CONTEXT], ids=["cpu-step", "all-in-one-step"])
async def test_32_prompts_at_full_context_are_never_declared_wedged(step_tokens):
    """With vLLM's CPU step, and with the worst case: every prompt prefilled in one step, so that no request
    emits anything until all 32 are prefilled (~3.3 s here, against a floor of 0.5 s)."""
    engine = SteppedEngine(step_tokens=step_tokens)
    host = _host(engine)
    await _measure_pace(host)

    engine.gather = 32
    results = await asyncio.gather(*(_run(host, FULL_CONTEXT - 8) for _ in range(32)))

    assert [tokens for _, tokens in results] == [8] * 32
    assert host.supervisor.wedged_total == 0
    await host.check_health()
    assert host.routing_stats()["serving"] is True
    if step_tokens > STEP_TOKENS:  # not a trivial pass: the engine was silent for many floors
        assert min(first for first, _ in results) > 4 * FLOOR_S


async def test_a_slow_engine_that_progresses_is_never_flagged():
    engine = SteppedEngine(decode_step_s=0.6 * FLOOR_S)  # a token every 0.3 s: slow, but progress
    host = _host(engine)
    _, tokens = await _run(host, 100, max_tokens=12)  # ~3.6 s: several bounds' worth
    assert tokens == 12 and host.supervisor.wedged_total == 0
    await host.check_health()


async def test_an_engine_slower_than_100_tokens_per_s_is_not_declared_wedged_before_its_first_rate():
    """Issue 27: before any rate was measured the watch assumed 100 prompt tokens/s, so an engine prefilling at
    20 tokens/s (a 7B model on a few shared cores) was declared wedged part-way through a 60-token prompt."""
    engine = SteppedEngine(prefill_tokens_per_s=20.0)
    host = _host(engine)
    first, tokens = await _run(host, 60, max_tokens=2)
    assert first > 2.5 and tokens == 2 and host.supervisor.wedged_total == 0


async def test_a_client_slower_than_the_engine_is_not_a_stall():
    """The engine has emitted all of a request's tokens; its reader takes longer than the bound to read them."""
    engine = SteppedEngine()
    host = _host(engine)
    stream = host.generate(make_request(_prompt(50), max_tokens=4, ignore_eos=True))
    assert isinstance(await anext(stream), Admitted)
    await until(lambda: engine.stats().running == 0, what="the engine done with the request")
    done_at = time.monotonic()
    await until(lambda: time.monotonic() - done_at > 3 * host.supervisor.watch.bound_s(None), timeout_s=30,
                what="three bounds passed with the reader not reading")
    assert host.supervisor.wedged_total == 0 and host.routing_stats()["serving"] is True
    assert len([d async for d in stream]) == 4  # all there


async def test_a_stopped_engine_is_declared_wedged_within_the_bound_and_not_before():
    engine = SteppedEngine(decode_step_s=0.01)
    host = _host(engine)
    await _measure_pace(host)
    streams = [host.generate(make_request(_prompt(1000), max_tokens=60, ignore_eos=True)) for _ in range(4)]
    for s in streams:
        assert isinstance(await anext(s), Admitted)
    engine.stop()
    outcomes: list[BaseException | None] = []

    async def drain(stream):
        try:
            async for _ in stream:
                pass
            outcomes.append(None)
        except ServiceUnavailable as err:
            outcomes.append(err)

    readers = [asyncio.create_task(drain(s)) for s in streams]
    await until(lambda: host.supervisor.wedged_total == 1, timeout_s=10, what="the engine declared wedged")
    quiet = time.monotonic() - engine.last_emit
    stall = host.supervisor.last_stall
    assert stall is not None and stall.prefill_tokens == 0  # all four were decoding: the floor is the bound
    assert stall.bound_s == pytest.approx(FLOOR_S)
    assert quiet > stall.bound_s  # not before
    assert quiet < stall.bound_s + 2 * host.supervisor.watch.tick_s() + 0.5  # the bound and a tick (+ a busy loop)

    await asyncio.gather(*readers)
    assert len(outcomes) == 4 and all(isinstance(e, ServiceUnavailable) for e in outcomes)
    assert all(e.status == 503 and e.retry_after_s and "retry" in e.message for e in outcomes if e)
    assert host.routing_stats()["serving"] is False
    with pytest.raises(RuntimeError, match="wedged"):  # no factory: Serve replaces the replica
        await host.check_health()
    with pytest.raises(ServiceUnavailable, match="wedged") as refused:
        await anext(host.generate(make_request("hello")))
    assert refused.value.retry_after_s
    stats = await host.stats()
    assert stats.wedged_total == 1 and stats.healthy is False
    text = Metrics().render({MODEL_ID: {"r1": stats}}).decode()
    assert f'app_engine_wedged_total{{model_name="{MODEL_ID}",replica="r1"}} 1.0' in text
    assert host.admission.stats().in_system == 0  # every ticket released


async def test_an_engine_stopped_while_prefilling_is_given_the_prefill_and_then_declared_wedged():
    engine = SteppedEngine(prefill_tokens_per_s=PREFILL_TOKENS_PER_S / 4)  # 4000 tokens: 0.8 s of prefill
    host = _host(engine)
    rate = await _measure_pace_at(host, PREFILL_TOKENS_PER_S / 4)
    firsts = [asyncio.create_task(anext(host.generate(make_request(_prompt(1000), max_tokens=8, ignore_eos=True))))
              for _ in range(4)]
    await engine.wait_running(4)
    stopped_at = time.monotonic()
    engine.stop()  # the step prefilling them never ends
    await until(lambda: host.supervisor.wedged_total == 1, timeout_s=20, what="the engine declared wedged")
    quiet = time.monotonic() - stopped_at
    stall = host.supervisor.last_stall
    assert stall is not None and stall.prefill_tokens == 4000
    assert stall.prefill_tokens_per_s <= 1.2 * rate
    assert stall.bound_s == pytest.approx(FLOOR_S + MARGIN * 4000 / stall.prefill_tokens_per_s)
    assert quiet > stall.bound_s  # not before: the prefill was given its time (and the margin)
    assert quiet < stall.bound_s + 2 * host.supervisor.watch.tick_s() + 0.5
    for first in firsts:
        with pytest.raises(EngineWedged) as ended:  # they were what the bound waited for: sent on with more time
            await first
        assert ended.value.retry_after_s and ended.value.status == 503


async def test_requests_queued_behind_a_wedged_engine_are_refused_retryable():
    engine = SteppedEngine()
    host = EngineHost(_config(max_ongoing_requests=1).models[0], engine, ServiceConfig(), progress_watch=_watch())
    running = host.generate(make_request(_prompt(10), max_tokens=60, ignore_eos=True))
    assert isinstance(await anext(running), Admitted)
    queued = asyncio.create_task(anext(host.generate(make_request(_prompt(10), max_tokens=4))))
    await until(lambda: host.admission.stats().waiting == 1, what="the second request queued")
    engine.stop()
    with pytest.raises(ServiceUnavailable):
        async for _ in running:
            pass
    with pytest.raises(ServiceUnavailable) as refused:
        await queued
    assert refused.value.retry_after_s
    assert host.admission.stats().in_system == 0


# -- in-place restart ---------------------------------------------------------------------------------------


class Factory:
    """The engines a host builds for itself, as `replicas.make_engine` would; each may block or fail its start."""

    def __init__(self, kind: type[SteppedEngine] = SteppedEngine, **engine_kw):
        self.kind = kind
        self.engine_kw = engine_kw
        self.built: list[SteppedEngine] = []

    def __call__(self) -> SteppedEngine:
        engine = self.kind(**self.engine_kw)
        self.built.append(engine)
        return engine


async def test_dead_engine_is_restarted_in_place_and_serves_again():
    gate = threading.Event()
    factory = Factory(start_blocks=gate)
    first = SteppedEngine(decode_step_s=0.01)
    host = _host(first, factory)
    stream = host.generate(make_request(_prompt(100), max_tokens=60, ignore_eos=True))
    assert isinstance(await anext(stream), Admitted)
    first.kill()
    with pytest.raises(ServiceUnavailable) as ended:
        async for _ in stream:
            pass
    assert ended.value.retry_after_s

    # restarting: the old engine is shut down, the new one is starting (blocked here)
    await until(lambda: first.shut_down and len(factory.built) == 1, what="the old engine shut down, a new one built")
    await host.check_health()  # passes while the restart progresses: Serve must not kill the replica
    assert host.routing_stats()["serving"] is False
    with pytest.raises(ServiceUnavailable, match="restarting") as refused:
        await anext(host.generate(make_request("hello")))
    assert refused.value.retry_after_s >= 1
    assert (await host.stats()).restarting is True

    gate.set()
    await until(lambda: host.supervisor.restarts_total == 1, what="the restart done")
    assert host.engine is factory.built[0] and host.routing_stats()["serving"] is True
    await host.check_health()
    _, tokens = await _run(host, 100, max_tokens=5)
    assert tokens == 5
    stats = await host.stats()
    assert (stats.restarts_total, stats.restarting, stats.healthy) == (1, False, True)
    text = Metrics().render({MODEL_ID: {"r1": stats}}).decode()
    assert f'app_engine_restarts_total{{model_name="{MODEL_ID}",replica="r1"}} 1.0' in text


async def test_wedged_engine_is_restarted_in_place():
    factory = Factory()
    first = SteppedEngine(decode_step_s=0.01)
    host = _host(first, factory)
    stream = host.generate(make_request(_prompt(100), max_tokens=60, ignore_eos=True))
    assert isinstance(await anext(stream), Admitted)
    first.stop()
    with pytest.raises(ServiceUnavailable, match="stopped serving"):
        async for _ in stream:
            pass
    await until(lambda: host.supervisor.restarts_total == 1, what="the wedged engine restarted")
    assert host.supervisor.wedged_total == 1 and first.shut_down and host.engine is factory.built[0]
    _, tokens = await _run(host, 100, max_tokens=5)
    assert tokens == 5


async def test_a_failed_restart_fails_the_health_check_so_serve_replaces_the_replica():
    factory = Factory(start_fails=True)
    first = SteppedEngine()
    host = _host(first, factory)
    first.kill()
    await host.check_health()  # found dead here: the restart begins, and the replica is healthy meanwhile

    async def fails() -> bool:
        try:
            await host.check_health()
        except RuntimeError as err:
            return "restart" in str(err) and "weights missing" in str(err)
        return False

    await until(fails, what="the health check failing once the restart failed")
    assert factory.built and host.routing_stats()["serving"] is False
    with pytest.raises(ServiceUnavailable):
        await anext(host.generate(make_request("hello")))


async def test_a_restart_past_its_deadline_fails_the_health_check(monkeypatch):
    monkeypatch.setattr("app.host.restart_budget.RESTART_MIN_DEADLINE_S", 0.3)
    gate = threading.Event()
    factory = Factory(start_blocks=gate)
    first = SteppedEngine()
    host = _host(first, factory)
    first.kill()
    await host.check_health()  # found dead: the restart begins, and passes while within its deadline
    try:
        await until(lambda: factory.built, what="a new engine built")
        await host.check_health()

        async def fails() -> bool:
            try:
                await host.check_health()
            except RuntimeError as err:
                return "not done" in str(err)
            return False

        await until(fails, what="the health check failing past the restart's deadline")
    finally:
        gate.set()  # let the start thread end


async def test_a_crash_loop_is_left_to_serve():
    factory = Factory()
    host = _host(SteppedEngine(), factory)
    for restarts in range(RESTART_LIMIT - 1):
        host.engine.kill()
        with pytest.raises(ServiceUnavailable):
            async for _ in host.generate(make_request("hello")):
                pass
        await until(lambda n=restarts: host.supervisor.restarts_total == n + 1, what=f"restart {restarts + 1}")
    host.engine.kill()  # the RESTART_LIMIT-th break within the window: no restart here
    with pytest.raises(RuntimeError, match="died"):
        await host.check_health()
    assert host.supervisor.restarts_total == RESTART_LIMIT - 1 and len(factory.built) == RESTART_LIMIT - 1


async def test_without_a_factory_a_dead_engine_is_left_to_serve():
    engine = SteppedEngine()
    host = _host(engine)
    engine.kill()
    with pytest.raises(RuntimeError, match="dead"):
        await host.check_health()
    assert (await host.stats()).restarting is False and host.supervisor.restarts_total == 0


def test_engine_processes_sigkills_a_stopped_process():
    """What a wedged EngineCore gets: SIGKILL, which a stopped process cannot sit out (SIGTERM it would)."""
    children: list[subprocess.Popen[bytes]] = []
    processes = EngineProcesses.started_by(lambda: children.append(subprocess.Popen(["sleep", "600"])))
    try:
        assert processes.pids == (children[0].pid,)
        psutil.Process(children[0].pid).suspend()  # SIGSTOP
        assert processes.kill() == 1
        assert children[0].wait(timeout=5) == -9
        assert processes.alive() == []
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()


async def test_over_http_a_wedged_stream_ends_with_an_error_event_and_the_restart_answers_503_then_serves():
    gate = threading.Event()
    factory = Factory(start_blocks=gate)
    config = _config()
    host = EngineHost(config.models[0], SteppedEngine(stop_after_tokens=3), config.service, engine_factory=factory,
                      progress_watch=_watch())
    app = create_app(config, {MODEL_ID: host})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test", timeout=30) as client:
        body = chat_body(max_tokens=50, ignore_eos=True, stream=True)
        streamed = await client.post("/v1/chat/completions", json=body)
        assert streamed.status_code == 200  # the stream had begun
        events = sse.parse(streamed.text)
        assert events[-1] == "[DONE]"
        error = events[-2]
        assert isinstance(error, dict) and error["error"]["code"] == "engine_unavailable"
        assert "wedged" in error["error"]["message"]
        assert not any(isinstance(e, dict) and e.get("choices") and e["choices"][0].get("finish_reason")
                       for e in events)  # never a silent "stop" or "length"

        await until(lambda: factory.built, what="the restart under way")
        refused = await client.post("/v1/chat/completions", json=chat_body())
        assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1
        assert "restarting" in refused.json()["error"]["message"]
        assert (await client.get("/livez")).status_code == 200
        assert (await client.get("/health")).status_code == 503

        gate.set()
        await until(lambda: host.supervisor.restarts_total == 1, what="the restart done")
        assert (await client.get("/health")).status_code == 200
        served = await client.post("/v1/chat/completions", json=chat_body(max_tokens=4))
        assert served.status_code == 200 and served.json()["usage"]["completion_tokens"] == 4
        metrics = (await client.get("/metrics")).text
        assert f'app_engine_wedged_total{{model_name="{MODEL_ID}",replica="local"}} 1.0' in metrics
        assert f'app_engine_restarts_total{{model_name="{MODEL_ID}",replica="local"}} 1.0' in metrics


class ProcessEngine(SteppedEngine):
    """Starts a child process, as vLLM starts its EngineCore, which its own shutdown leaves running."""

    def start(self) -> None:
        super().start()
        self.child = subprocess.Popen(["sleep", "600"])


async def test_every_process_an_engine_started_is_killed_by_the_restart_and_by_shutdown():
    factory = Factory(kind=ProcessEngine)
    first = ProcessEngine(decode_step_s=0.01)
    host = _host(first, factory)
    children = [first.child]
    try:
        stream = host.generate(make_request(_prompt(10), max_tokens=60, ignore_eos=True))
        assert isinstance(await anext(stream), Admitted)
        psutil.Process(first.child.pid).suspend()  # the EngineCore stopped (here: only its stand-in)
        first.stop()
        with pytest.raises(ServiceUnavailable):
            async for _ in stream:
                pass
        await until(lambda: host.supervisor.restarts_total == 1, what="the restart done")
        assert first.child.wait(timeout=5) == -9  # SIGKILLed, though stopped
        second = factory.built[0]
        assert isinstance(second, ProcessEngine)
        children.append(second.child)
        assert second.child.poll() is None  # the new engine's process runs
        host.shutdown()
        assert second.child.wait(timeout=5) == -9
    finally:
        for child in children:
            if child.poll() is None:
                child.kill()
                child.wait()
