"""A replica is up before its engine: while the engine loads it answers 503 "starting" (readiness),
stays alive for Ray Serve (liveness), and a failed start fails liveness so Serve replaces it."""

from __future__ import annotations

import threading

import httpx
import pytest

from app.errors import ServiceUnavailable
from app.fake_engine import FakeEngine
from app.host import EngineHost
from app.ingress import create_app
from tests.support.fake_stack import MODEL_ID, chat_body, make_config, make_request


class SlowStartEngine(FakeEngine):
    def __init__(self, fail: bool = False):
        super().__init__(max_model_len=256, kv_cache_tokens=5000)
        self.release = threading.Event()
        self.fail = fail

    def start(self) -> None:
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("weights missing")
        super().start()


async def _wait_ready(host: EngineHost) -> None:
    import asyncio

    for _ in range(200):
        if host._ready.is_set():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never became ready")


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

        engine.release.set()
        await _wait_ready(host)
        assert host.admission.token_budget == 5000  # taken from the engine's KV cache once it is known
        assert (await client.get("/health")).status_code == 200
        assert (await client.post("/v1/chat/completions", json=chat_body())).status_code == 200


async def test_failed_start_fails_liveness_so_serve_replaces_the_replica():
    config = make_config()
    engine = SlowStartEngine(fail=True)
    engine.release.set()
    host = EngineHost(config.models[0], engine, config.service, start_in_background=True)
    import asyncio

    for _ in range(200):
        if host._start_error:
            break
        await asyncio.sleep(0.01)
    with pytest.raises(RuntimeError, match="weights missing"):
        await host.check_health()
    with pytest.raises(ServiceUnavailable):
        async for _ in host.generate(make_request("hi")):
            pass


def test_foreground_start_failure_raises():
    config = make_config()
    engine = SlowStartEngine(fail=True)
    engine.release.set()
    with pytest.raises(RuntimeError, match="failed to start"):
        EngineHost(config.models[0], engine, config.service)
