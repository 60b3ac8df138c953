"""The Ray Serve replica classes: what runs inside each replica process, and the engine it gets.

- `EngineReplica`: one engine replica behind a handle (several models, a separate ingress).
- `ModelServer`: one engine replica that also serves the HTTP API itself (one model, colocated).
- `Ingress`: the HTTP API alone, reaching the engines through handles.

Each holds its `EngineHost` (or handles) and delegates to it; `make_engine` is the one place that
chooses between vLLM and the fake engine. Serve calls `check_health` on every replica and
`__del__` when it stops one: the listening socket closes first, then the engine stops with
every process it started.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator
from dataclasses import replace
from typing import Any

import psutil
import ray
from fastapi import FastAPI
from ray import serve
from ray.serve.handle import DeploymentHandle

from app.api_keys import API_KEYS_ENV
from app.config.app_config import AppConfig
from app.config.common import LOOPBACK_HOSTS, ConfigError
from app.config.model import ModelConfig
from app.config.service import ServiceConfig
from app.engine.interface import Admitted, Embeddings, EmbedRequest, Engine, GenerateRequest, PromptInput
from app.errors import ServiceError
from app.host.engine_host import EngineHost
from app.host.replica_load import refused_at_ingress
from app.host.resuming_host import ResumingHost
from app.host.stats import ReplicaStats
from app.http.ingress import create_app
from app.http.listener import HttpListener
from app.logs import configure_logging
from app.rayserve.handle_backend import HandleBackend
from app.rayserve.handle_errors import Refused
from app.rayserve.request_router import ROUTING_STATS_PERIOD_S, Addressed
from app.routing.model_routing import ModelRouting
from app.tenancy import Tenants

log = logging.getLogger(__name__)
# The Ray release whose replica code `_keep_replica_port_on_loopback` patches (ray.serve._private.replica).
_PATCHED_RAY_VERSION = "2.60.0"


def make_engine(model: ModelConfig) -> Engine:
    """The engine a model's config asks for; imports vLLM only when it is used."""
    if model.engine_kind == "fake":
        from app.engine.fake import FakeEngine

        e = model.engine
        return FakeEngine(max_model_len=e.max_model_len, token_delay_s=e.fake_token_delay_s,
                          prefill_s_per_token=e.fake_prefill_s_per_token, block_tokens=e.fake_block_tokens)
    from app.engine.vllm.engine import VLLMEngine

    return VLLMEngine(model)


def _keep_replica_port_on_loopback() -> None:
    """Ray Serve 2.60 binds every replica's inter-deployment gRPC server to [::] (all interfaces),
    whatever the node IP. On a loopback-only node (the CLI's private Ray) bind it to 127.0.0.1 too,
    so a local service opens no port to the network. On a cluster node this changes nothing. Written
    for Ray 2.60.0's `replica.add_port_to_grpc_server`; on another release it is skipped, loudly."""
    from ray.serve._private import replica

    if ray.util.get_node_ip_address() not in ("127.0.0.1", "::1"):
        return
    original = getattr(replica, "add_port_to_grpc_server", None)
    if ray.__version__ != _PATCHED_RAY_VERSION or original is None:
        log.warning(
            "Ray %s is not %s, for which the replica's gRPC port is kept on loopback; it may listen on every interface",
            ray.__version__,
            _PATCHED_RAY_VERSION,
        )
        return
    if getattr(original, "loopback_only", False):
        return

    def add_port_on_loopback(server: Any, address: str) -> Any:
        return original(server, address.replace("[::]", "127.0.0.1"))

    add_port_on_loopback.loopback_only = True  # type: ignore[attr-defined]
    replica.add_port_to_grpc_server = add_port_on_loopback


def _serve_proxy_host() -> str | None:
    """The host Serve's HTTP proxies bind, from the Serve controller (Ray 2.60's client; None if unknown)."""
    try:
        from ray.serve.context import _get_global_client

        client = _get_global_client()
        return str(client.http_config.host) if client is not None else None
    except Exception:
        return None


def _refuse_open_access(config: AppConfig, listen: bool) -> None:
    """No API key and reachable beyond loopback: refuse to start (or warn, per `service.without_api_keys`).
    Reachable: the replica's own socket on a non-loopback `service.host`, or Serve's proxy bound to one."""
    if Tenants(config).keys:
        return
    where = config.service.host if listen else _serve_proxy_host()
    if where is None:
        where = ray.util.get_node_ip_address()  # the proxy's host is unknown: assume this node's address
    if where in LOOPBACK_HOSTS:
        return
    message = (
        f"no API key is configured and the service is reachable on {where}: anyone who can connect can use "
        f"it. Set service.api_keys (plain or sha256:<hex>) or {API_KEYS_ENV} where the app is built, bind "
        "to 127.0.0.1, or set service.without_api_keys: warn"
    )
    if config.service.without_api_keys == "refuse":
        raise ConfigError(message)
    log.warning("%s", message)


def _this_replica_id() -> str:
    """Serve's id of the replica this runs in (what `request_router` sees as `replica_id.unique_id`)."""
    try:
        return serve.get_replica_context().replica_id.unique_id
    except Exception:  # outside a Serve replica (tests that build one directly)
        return ""


def _routing(model: ModelConfig) -> ModelRouting | None:
    """The fleet router of a model behind the ingress. Made whatever `num_replicas` says (a Serve config or the
    autoscaler may run more); it renders prompts (with the model's tokenizer, loaded here) only while the model has
    several replicas."""
    if model.deployment.routing != "earliest_first_token":
        return None
    return ModelRouting.for_model(model, ROUTING_STATS_PERIOD_S)


def _listen(api: FastAPI, service: ServiceConfig) -> HttpListener:
    listener = HttpListener(api, service.host, service.port, service)
    listener.start()  # the constructor runs in the replica's event loop, where requests will run
    return listener


class EngineReplica:
    """An `EngineHost` as a Ray Serve replica, called through handles (`rayserve.handle_backend.HandleBackend`)."""

    def __init__(self, model: ModelConfig, service: ServiceConfig):
        _keep_replica_port_on_loopback()
        # The engine loads in the constructor: Serve routes to a replica only once its constructor has
        # returned, so no request (and no replacement, scale-up or rolling update) reaches a loading engine.
        # An engine that dies or wedges later is restarted in place (host/engine_host.py); the router skips the replica
        # meanwhile (it reports serving: False).
        self.host = EngineHost(model, make_engine(model), service, engine_factory=lambda: make_engine(model))
        self._replica_id = _this_replica_id()
        # From this process's start to serving: what the autoscaling policy expects of the next replica it asks for.
        self._start_s = time.time() - psutil.Process().create_time()

    async def generate_remote(self, request: GenerateRequest, avoid: tuple[str, ...] = (),
                              prefer: tuple[str, ...] = ()) -> AsyncGenerator[Any, None]:
        """`generate` for callers across the Ray handle: errors come back as `Refused` values naming this replica.
        `avoid` and `prefer` are for the router only (replicas that already refused this request; the ingress's
        ranking of replicas, rayserve/request_router.py)."""
        engine = self.host.supervisor.serving_engine()
        try:
            async for item in self.host.generate(request):
                yield replace(item, replica=self._replica_id) if isinstance(item, Admitted) else item
        except ServiceError as err:
            yield Refused(err, self._replica_id, in_flight=engine is not None and self.host.supervisor.left(engine))

    async def embed_remote(self, request: EmbedRequest, avoid: tuple[str, ...] = ()) -> Embeddings | Refused:
        """`embed` for callers across the Ray handle: a refusal comes back as a `Refused` value naming this replica
        (`avoid`: for the router, as `generate_remote`'s), saying whether the engine broke with the request in it."""
        engine = self.host.supervisor.serving_engine()
        try:
            return await self.host.embed(request)
        except ServiceError as err:
            return Refused(err, self._replica_id, in_flight=engine is not None and self.host.supervisor.left(engine))

    async def tokenize(self, prompt: PromptInput) -> list[int]:
        return await self.host.tokenize(prompt)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await self.host.detokenize(token_ids)

    async def check_health(self) -> None:
        await self.host.check_health()

    async def check_ready(self) -> None:
        await self.host.check_ready()

    async def stats(self) -> ReplicaStats:
        return await self.host.stats()

    async def stats_of(self, target: Addressed) -> tuple[str, ReplicaStats]:
        """This replica's figures for the ingress that asked every replica (`target` steers the router to it); with
        its own id, in case the router could not send it where it was meant to go."""
        return self._replica_id, await self.host.stats()

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve's routing-stats hook, read by `ServingReplicaRouter`."""
        return self.host.routing_stats()

    def record_autoscaling_stats(self) -> dict[str, float]:
        """Serve's autoscaling hook, read by the policy (scaling/serve_policy.py) when the deployment autoscales."""
        return {**self.host.autoscaling_stats(), "start_s": self._start_s}

    def refused_at_ingress(self, max_steps: int) -> None:
        """Decode steps the ingress refused by time on the deployment's behalf (rayserve/unmet_demand.py)."""
        refused_at_ingress(self.host.admission, max_steps)

    def __del__(self) -> None:
        host = getattr(self, "host", None)
        if host is not None:
            host.shutdown()


@serve.ingress()
class ModelServer:
    """The single-model topology: each engine replica serves the HTTP API itself, calling its own
    `EngineHost` in-process. Tokens then cross no Ray handle between ingress and engine (one hop per
    token fewer, and no ingress process competing with the engine for the CPU). With `listen`, the
    replica also owns the socket (`HttpListener`); otherwise Serve's proxy spreads requests over the
    replicas."""

    def __init__(self, config: AppConfig, listen: bool = False):
        _keep_replica_port_on_loopback()
        model = config.models[0]
        _refuse_open_access(config, listen)
        # Loads now: see EngineReplica. An engine that dies or wedges is restarted in place (host/supervisor.py), and
        # the requests it had continue on the new one (host/resuming_host.py): this replica has no other to give them.
        self.host = ResumingHost(model, make_engine(model), config.service, engine_factory=lambda: make_engine(model))
        self._api = create_app(config, {model.id: self.host}, behind_serve_proxy=not listen, watch_event_loop=True)
        self._listener = _listen(self._api, config.service) if listen else None

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self._api

    async def check_health(self) -> None:
        await self.host.check_health()

    def record_routing_stats(self) -> dict[str, Any]:
        """Serve's routing-stats hook, read by `ServingReplicaRouter` (several replicas behind the proxy)."""
        return self.host.routing_stats()

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests with 503 and wait up to `grace_s` for those in flight; returns how many remain."""
        self.host.close_admission()
        return await self._api.state.ingress.lifecycle.drain(grace_s)

    def __del__(self) -> None:
        listener: HttpListener | None = getattr(self, "_listener", None)
        if listener is not None:
            listener.stop_accepting()
        host = getattr(self, "host", None)
        if host is not None:
            host.shutdown()


@serve.ingress()
class Ingress:
    """The HTTP API for several models (or `colocate_ingress: false`), one handle per engine deployment."""

    def __init__(self, config: AppConfig, engines: dict[str, DeploymentHandle], listen: bool = False):
        _keep_replica_port_on_loopback()
        configure_logging(config.service.log_level)
        _refuse_open_access(config, listen)
        backends = {m.id: HandleBackend(engines[m.id], _routing(m)) for m in config.models}
        self._api = create_app(config, backends, behind_serve_proxy=not listen, watch_event_loop=True)
        self._listener = _listen(self._api, config.service) if listen else None

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self._api

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests with 503 and wait up to `grace_s` for those in flight; returns how many remain."""
        return await self._api.state.ingress.lifecycle.drain(grace_s)

    def __del__(self) -> None:
        listener: HttpListener | None = getattr(self, "_listener", None)
        if listener is not None:
            listener.stop_accepting()
