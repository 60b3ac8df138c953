"""A replica is up before its engine: while the engine loads it answers 503 "starting" (readiness),
stays alive for Ray Serve (liveness), and a failed start fails liveness so Serve replaces it."""

from __future__ import annotations

import threading

import httpx
import pytest

from app.engine.fake import FakeEngine
from app.errors import ServiceUnavailable
from app.host.engine_host import EngineHost
from app.http.ingress import create_app
from tests.support.fake_stack import MODEL_ID, chat_body, make_config, make_request
from tests.support.waiting import until


class SlowStartEngine(FakeEngine):
    """Its `start()` (run by the host in a background thread) blocks until `release` is set."""

    def __init__(self, fail: bool = False):
        super().__init__(max_model_len=256, kv_cache_tokens=5000)
        self.release = threading.Event()
        self.fail = fail

    def start(self) -> None:
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("weights missing")
        super().start()


async def _ready(host: EngineHost) -> bool:
    """Readiness as the replica's /health sees it (public: `check_ready`)."""
    try:
        await host.check_ready()
    except ServiceUnavailable:
        return False
    return True


async def _fails_liveness(host: EngineHost) -> bool:
    try:
        await host.check_health()
    except RuntimeError:
        return True
    return False


async def test_starting_replica_refuses_with_503_then_serves():
    config = make_config()
    engine = SlowStartEngine()
    host = EngineHost(config.models[0], engine, config.service, start_in_background=True)
    app = create_app(config, {MODEL_ID: host})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
        await host.check_health()  # alive while loading: Serve must not kill it
        with pytest.raises(ServiceUnavailable, match="starting"):
            await host.check_ready()
        health = await client.get("/health")
        assert health.status_code == 503 and health.json()["models"] == {MODEL_ID: False}
        r = await client.post("/v1/chat/completions", json=chat_body())
        assert r.status_code == 503 and "starting" in r.json()["error"]["message"]
        assert int(r.headers["retry-after"]) >= 1
        assert (await host.stats()).ready is False
        assert not engine.started_event.is_set()

        engine.release.set()
        await engine.wait_started()
        await until(lambda: _ready(host), what="the host ready after its engine started")
        assert host.admission.token_budget == 5000  # taken from the engine's KV cache once it is known
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200


async def test_failed_start_fails_liveness_so_serve_replaces_the_replica():
    config = make_config()
    engine = SlowStartEngine(fail=True)
    host = EngineHost(config.models[0], engine, config.service, start_in_background=True)
    await host.check_health()  # still loading: alive
    engine.release.set()
    await until(lambda: _fails_liveness(host), what="liveness failing after the failed start")
    with pytest.raises(RuntimeError, match="weights missing"):
        await host.check_health()
    with pytest.raises(ServiceUnavailable, match="weights missing"):
        async for _ in host.generate(make_request("hi")):
            pass
    assert not engine.started_event.is_set()


def test_foreground_start_failure_raises():
    config = make_config()
    engine = SlowStartEngine(fail=True)
    engine.release.set()
    with pytest.raises(RuntimeError, match="failed to start"):
        EngineHost(config.models[0], engine, config.service)


def test_foreground_start_has_started_the_engine_when_the_host_exists():
    config = make_config()
    engine = FakeEngine(kv_cache_tokens=777)
    host = EngineHost(config.models[0], engine, config.service)
    assert engine.started_event.is_set()
    assert host.admission.token_budget == 777
