"""Several engine replicas in-process, each an `EngineHost` on a fake engine with a cost model, behind a stand-in for
the Ray Serve handle that sends each call where the fleet router ranked it first (as `ServingReplicaRouter` does), so
`HandleBackend` with fleet routing is driven end to end without Ray: fast and deterministic."""

from __future__ import annotations

import asyncio
from collections import Counter
from contextlib import aclosing
from dataclasses import replace

from app.engine.fake import FakeEngine
from app.engine.interface import Admitted, GenerateRequest
from app.errors import ServiceError
from app.host.engine_host import EngineHost
from app.host.replica_load import ReplicaLoad
from app.rayserve.handle_backend import HandleBackend
from app.rayserve.handle_errors import Refused
from app.routing.fleet_router import FleetRouter
from app.routing.model_routing import ModelRouting
from tests.support.fake_stack import make_config


class _Response:
    def __init__(self, fleet: FakeFleet, replica: str, request: GenerateRequest):
        self._fleet, self._replica, self._request = fleet, replica, request
        self.cancelled = False

    def __aiter__(self):
        return self._items()

    async def _items(self):
        host = self._fleet.hosts[self._replica]
        try:
            async with aclosing(host.generate(self._request)) as stream:
                async for item in stream:
                    yield replace(item, replica=self._replica) if isinstance(item, Admitted) else item
        except ServiceError as err:
            yield Refused(err, self._replica)

    def cancel(self) -> None:
        self.cancelled = True


class _Generate:
    def __init__(self, fleet: FakeFleet):
        self._fleet = fleet

    def remote(self, request: GenerateRequest, avoid: tuple[str, ...] = (), prefer: tuple = ()):
        ranked = [r for group in prefer for r in group]  # a group's first: Serve's probe is not modelled here
        order = [r for r in ranked if r not in avoid] or [r for r in self._fleet.hosts if r not in avoid]
        replica = order[0]
        self._fleet.sent.append((request.request_id, replica))
        return _Response(self._fleet, replica, request)


class FakeFleet:
    """`replicas` engine replicas named r1, r2, ...; `engine` settings for each fake engine (its cost model),
    `deployment` for each replica's admission."""

    def __init__(self, replicas: int = 2, engine: dict | None = None, deployment: dict | None = None,
                 router: FleetRouter | None = None):
        config = make_config(deployment=deployment or {}, engine={"max_model_len": 4096},
                             limits={"max_tokens": 64, "default_max_tokens": 16})
        self.config, self.model = config, config.models[0]
        self.engines = {f"r{i}": FakeEngine(**(engine or {})) for i in range(1, replicas + 1)}
        self.hosts = {r: EngineHost(self.model, e, config.service) for r, e in self.engines.items()}
        self.sent: list[tuple[str, str]] = []  # (request id, replica) per call
        self.stream = self
        self.routing = ModelRouting(self.model, FakeEngine(), router or FleetRouter())
        self.backend = HandleBackend(self, self.routing)  # type: ignore[arg-type]
        self.backend._loads = self.loads  # type: ignore[method-assign]  # live, not polled once a second

    def options(self, **_options):
        return self

    @property
    def generate_remote(self) -> _Generate:
        return _Generate(self)

    def loads(self) -> dict[str, ReplicaLoad]:
        return {r: ReplicaLoad.of(h.routing_stats()) for r, h in self.hosts.items()}

    def share(self) -> Counter[str]:
        return Counter(replica for _, replica in self.sent)

    async def answer(self, request: GenerateRequest) -> list:
        return [item async for item in self.backend.generate(request)]

    async def answer_all(self, requests: list[GenerateRequest]) -> list[list]:
        return list(await asyncio.gather(*(self.answer(r) for r in requests)))
