"""The engine's life in one state (app/host/supervisor.py), as a replica's host lives it: loading while the engine
starts, serving, restarting in place when it dies with a factory to build another, broken without one, draining
once the replica closes its admission (no new work routed to it, no restart), stopped at shutdown."""

from __future__ import annotations

import threading

import pytest

from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.errors import ServiceUnavailable
from app.host.engine_host import EngineHost
from app.host.supervisor import EngineState
from tests.support.fake_stack import make_config, make_request
from tests.support.waiting import until


class SlowStart(FakeEngine):
    def __init__(self, gate: threading.Event):
        super().__init__()
        self.gate = gate

    def start(self) -> None:
        self.gate.wait(30)
        super().start()


def _host(engine: FakeEngine, factory=None, background: bool = False) -> EngineHost:
    return EngineHost(make_config().models[0], engine, ServiceConfig(), start_in_background=background,
                      engine_factory=factory)


async def test_loading_then_serving():
    gate = threading.Event()
    host = _host(SlowStart(gate), background=True)
    assert host.supervisor.state is EngineState.LOADING
    with pytest.raises(ServiceUnavailable, match="starting"):
        await anext(host.generate(make_request("hello")))
    assert host.routing_stats()["serving"] is False
    gate.set()
    await until(lambda: host.supervisor.state is EngineState.SERVING, what="serving")
    assert host.routing_stats()["serving"] is True
    host.shutdown()
    assert host.supervisor.state is EngineState.STOPPED


async def test_a_dead_engine_restarts_with_a_factory_and_is_broken_without():
    built: list[FakeEngine] = []

    def factory() -> FakeEngine:
        built.append(FakeEngine())
        return built[-1]

    host = _host(FakeEngine(), factory)
    host.engine.kill()
    await host.check_health()  # finds it dead: a restart begins, and the health check passes meanwhile
    assert host.supervisor.state in (EngineState.RESTARTING, EngineState.SERVING)
    await until(lambda: host.supervisor.state is EngineState.SERVING and host.supervisor.restarts_total == 1,
                what="restarted")
    assert host.engine is built[0]

    alone = _host(FakeEngine())
    alone.engine.kill()
    with pytest.raises(RuntimeError, match="engine unusable"):
        await alone.check_health()
    assert alone.supervisor.state is EngineState.BROKEN and alone.routing_stats()["serving"] is False
    assert (await alone.stats()).healthy is False


async def test_a_draining_replica_takes_no_new_work_and_is_not_restarted():
    host = _host(FakeEngine(), factory=FakeEngine)
    host.close_admission()
    assert host.supervisor.state is EngineState.DRAINING
    assert host.routing_stats()["serving"] is False  # the router sends it nothing new
    host.engine.kill()
    with pytest.raises(RuntimeError, match="engine unusable"):
        await host.check_health()
    assert host.supervisor.state is EngineState.BROKEN and host.supervisor.restarts_total == 0
