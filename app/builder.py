"""Wires the configuration into a Ray Serve application: `build_app(args)`.

One engine deployment per model (each replica an `EngineHost` owning one
engine) and one ingress deployment (the FastAPI app) holding a handle to each.
A Serve config file points `import_path` at `app.builder:build_app`; the CLI
calls the same function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, AsyncIterator

from ray import serve
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError, TaskCancelledError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError
from ray.serve.handle import DeploymentHandle

from app.config import AppConfig, ConfigError, ModelConfig, ServiceConfig, load_config, parse_config
from app.errors import QueueFull, ServiceError, ServiceUnavailable
from app.http_listener import HttpListener
from app.ingress import create_app
from app.logs import configure_logging
from app.protocol import GenerateRequest, PromptInput
from app.server import EngineHost

INGRESS_NAME = "ingress"
# Serve's own per-replica cap sits above ours, so overflow reaches EngineHost and is refused fast and honestly.
_SERVE_SLACK = 8
_HTTP_HEADROOM = 1000
_UNAVAILABLE = (ActorDiedError, ActorUnavailableError, RayActorError, DeploymentUnavailableError)


def engine_deployment_name(model_id: str) -> str:
    return "engine-" + re.sub(r"[^A-Za-z0-9_-]", "-", model_id)


def _translate(err: BaseException) -> BaseException:
    """Ray wraps what a replica raised; give the ingress the service's own error back."""
    if isinstance(err, RayTaskError) and isinstance(err.cause, ServiceError):
        return err.cause
    if isinstance(err, ServiceError):
        return err
    if isinstance(err, BackPressureError):
        return QueueFull("Server is at capacity; retry after the Retry-After delay, with backoff", retry_after_s=1)
    if isinstance(err, TaskCancelledError):  # the call was cancelled under us (replica stopping); not a server bug
        return ServiceUnavailable("The request was cancelled by the serving layer; retry", retry_after_s=1)
    if isinstance(err, _UNAVAILABLE):
        return ServiceUnavailable("No engine replica is available for this model right now; retry shortly", retry_after_s=5)
    return err


class HandleBackend:
    """`EngineHost`'s interface, reached through a Ray Serve handle."""

    def __init__(self, handle: DeploymentHandle):
        self._handle = handle
        self._stream = handle.options(stream=True)

    async def generate(self, request: GenerateRequest) -> AsyncIterator[Any]:
        response = self._stream.generate_remote.remote(request)
        try:
            async for item in response:
                if isinstance(item, Refused):
                    raise item.error
                yield item
        except Exception as err:
            raise _translate(err) from None
        finally:
            try:
                response.cancel()  # no-op when finished; otherwise the replica sees CancelledError and aborts
            except Exception:  # cancel() re-raises a failed assignment (BackPressureError), already answered above
                pass

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._handle, method).remote(*args)
        except Exception as err:
            raise _translate(err) from None

    async def tokenize(self, prompt: PromptInput) -> list[int]:
        return await self._call("tokenize", prompt)

    async def detokenize(self, token_ids: list[int]) -> str:
        return await self._call("detokenize", token_ids)

    async def check_health(self) -> None:
        await self._call("check_health")

    async def check_ready(self) -> None:
        await self._call("check_ready")

    async def stats(self) -> dict[str, Any]:
        return await self._call("stats")


def _keep_replica_port_on_loopback() -> None:
    """Ray Serve 2.60 binds every replica's inter-deployment gRPC server to [::] (all interfaces),
    whatever the node IP. On a loopback-only node (the CLI's private Ray) bind it to 127.0.0.1 too,
    so a local service opens no port to the network. On a cluster node this changes nothing."""
    import ray
    from ray.serve._private import replica

    if ray.util.get_node_ip_address() not in ("127.0.0.1", "::1"):
        return
    original = replica.add_port_to_grpc_server
    if getattr(original, "loopback_only", False):
        return

    def add_port_on_loopback(server, address: str):
        return original(server, address.replace("[::]", "127.0.0.1"))

    add_port_on_loopback.loopback_only = True
    replica.add_port_to_grpc_server = add_port_on_loopback


@dataclass(frozen=True)
class Refused:
    """A `ServiceError` sent back over the handle as a value. Raised across Ray, every refusal would
    cost a traceback logged at ERROR in the replica and the caller; under overload that is most requests."""

    error: ServiceError


class EngineReplica(EngineHost):
    """`EngineHost` as a Ray Serve replica."""

    def __init__(self, model: ModelConfig, service: ServiceConfig):
        _keep_replica_port_on_loopback()
        super().__init__(model, service, start_in_background=True)

    async def generate_remote(self, request: GenerateRequest) -> AsyncIterator[Any]:
        """`generate` for callers across the Ray handle: errors come back as `Refused` values."""
        try:
            async for item in self.generate(request):
                yield item
        except ServiceError as err:
            yield Refused(err)


@serve.ingress()
class ModelServer(EngineReplica):
    """The single-model topology: each engine replica serves the HTTP API itself, calling its own
    `EngineHost` in-process. Tokens then cross no Ray handle between ingress and engine (one hop per
    token fewer, and no ingress process competing with the engine for the CPU). With `listen`, the
    replica also owns the socket (`HttpListener`); otherwise Serve's proxy spreads requests over the
    replicas."""

    def __init__(self, config: AppConfig, listen: bool = False):
        super().__init__(config.models[0], config.service)
        self._api = create_app(config, {self.model.id: self}, behind_serve_proxy=not listen)
        self._listener = _listen(self._api, config.service) if listen else None

    def __serve_build_asgi_app__(self):
        return self._api

    def __del__(self):
        if getattr(self, "_listener", None) is not None:
            self._listener.stop_accepting()
        super().__del__()

    async def drain(self, grace_s: float) -> int:
        self.close_admission()
        return await self._api.state.lifecycle.drain(grace_s)


@serve.ingress()
class Ingress:
    def __init__(self, config: AppConfig, engines: dict[str, DeploymentHandle], listen: bool = False):
        _keep_replica_port_on_loopback()
        configure_logging(config.service.log_level)
        self._api = create_app(config, {model_id: HandleBackend(h) for model_id, h in engines.items()}, behind_serve_proxy=not listen)
        self._listener = _listen(self._api, config.service) if listen else None

    def __serve_build_asgi_app__(self):
        return self._api

    def __del__(self):
        # Ray Serve calls this when it stops the replica.
        if getattr(self, "_listener", None) is not None:
            self._listener.stop_accepting()

    async def drain(self, grace_s: float) -> int:
        """Refuse new requests with 503 and wait up to `grace_s` for those in flight; returns how many remain."""
        return await self._api.state.lifecycle.drain(grace_s)


def _listen(api, service: ServiceConfig) -> HttpListener:
    listener = HttpListener(api, service.host, service.port)
    listener.start()  # the constructor runs in the replica's event loop, where requests will run
    return listener


def _engine_deployment(model: ModelConfig, config: AppConfig, cls: type = EngineReplica):
    dep = model.deployment
    serve_cap = dep.max_ongoing_requests + dep.max_queued_requests + _SERVE_SLACK
    if cls is ModelServer:
        # Every HTTP request reaches this replica (probes too), and refusing one in-process costs almost
        # nothing; a tight Serve cap would make the proxy queue them, then drop them as plain-text 503s.
        serve_cap = _HTTP_HEADROOM + serve_cap
    return serve.deployment(cls).options(
        name=engine_deployment_name(model.id),
        num_replicas=dep.num_replicas,
        ray_actor_options={"num_cpus": dep.num_cpus, "num_gpus": dep.num_gpus},
        max_ongoing_requests=serve_cap,
        max_queued_requests=serve_cap,
        health_check_period_s=dep.health_check_period_s,
        health_check_timeout_s=dep.health_check_timeout_s,
        graceful_shutdown_timeout_s=config.service.drain_grace_s,
    )


def colocated(config: AppConfig) -> bool:
    return config.service.colocate_ingress and len(config.models) == 1


def ingress_deployment_name(config: AppConfig) -> str:
    """The deployment that answers HTTP (and `drain`) for this config."""
    return engine_deployment_name(config.models[0].id) if colocated(config) else INGRESS_NAME


def one_http_replica(config: AppConfig) -> bool:
    """Whether a single replica answers all HTTP, so it can own the socket: the ingress (always one
    replica), or one engine replica serving its model colocated. Several replicas keep Serve's proxy,
    which spreads requests by queue length; the kernel would spread connections, and an SDK's
    keep-alive pool pins each client to one replica."""
    return not colocated(config) or config.models[0].deployment.num_replicas == 1


def build_from_config(config: AppConfig, listen: bool = False) -> serve.Application:
    """`listen`: the HTTP-facing replica binds `service.host:port` itself (requires `one_http_replica`);
    otherwise Serve's HTTP proxy answers HTTP (Serve configs, KubeRay)."""
    if listen and not one_http_replica(config):
        raise ConfigError("a replica can listen on the service port only when one replica answers all HTTP")
    if colocated(config):
        model = config.models[0]
        return _engine_deployment(model, config, ModelServer).bind(config, listen)
    engines = {m.id: _engine_deployment(m, config).bind(m, config.service) for m in config.models}
    ingress = serve.deployment(Ingress).options(
        name=INGRESS_NAME,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10_000,  # the ingress only awaits; the engines bound the work
        graceful_shutdown_timeout_s=config.service.drain_grace_s,
    )
    return ingress.bind(config, engines, listen)


def config_from_args(args: dict[str, Any]) -> AppConfig:
    """`args` from a Serve config: either `config_path: <yaml file>` or `config: {inline config}`."""
    args = dict(args or {})
    unknown = set(args) - {"config_path", "config"}
    if unknown:
        raise ConfigError(f"build_app args has unknown keys {sorted(unknown)}; pass 'config_path' or 'config'")
    if ("config_path" in args) == ("config" in args):
        raise ConfigError("build_app args needs exactly one of 'config_path' (a YAML file) or 'config' (the config inline)")
    if "config_path" in args:
        return load_config(args["config_path"])
    return parse_config(args["config"], origin="build_app args 'config'")


def build_app(args: dict[str, Any]) -> serve.Application:
    return build_from_config(config_from_args(args))
