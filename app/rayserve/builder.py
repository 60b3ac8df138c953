"""Wires the configuration into a Ray Serve application: config → deployments → `build_app(args)`.

One engine deployment per model and, with several models, one ingress deployment holding a handle
to each (the replica classes are in rayserve/replicas.py). A Serve config file points `import_path` at
`app.rayserve.builder:build_app`; the CLI calls `build_from_config`.
"""

from __future__ import annotations

import re
from typing import Any

from ray import serve
from ray.serve.config import RequestRouterConfig
from ray.serve.deployment import Deployment

from app.config.app_config import AppConfig, load_config, parse_config
from app.config.common import ConfigError
from app.config.model import ModelConfig
from app.rayserve.replicas import EngineReplica, Ingress, ModelServer
from app.rayserve.request_router import ROUTING_STATS_PERIOD_S, ROUTING_STATS_TIMEOUT_S, ServingReplicaRouter
from app.scaling.serve_policy import serve_autoscaling_config

INGRESS_NAME = "ingress"
# Serve's own per-replica cap sits above ours, so overflow reaches EngineHost and is refused fast and honestly.
_SERVE_SLACK = 8
_HTTP_HEADROOM = 1000
# Engine replicas are routed by rayserve/request_router.py. (A dict: Ray's pydantic-compat models confuse mypy.)
_ROUTER: dict[str, Any] = {
    "request_router_class": ServingReplicaRouter,
    "request_routing_stats_period_s": ROUTING_STATS_PERIOD_S,
    "request_routing_stats_timeout_s": ROUTING_STATS_TIMEOUT_S,
}


def engine_deployment_name(model_id: str) -> str:
    return "engine-" + re.sub(r"[^A-Za-z0-9_-]", "-", model_id)


def _per_node(limit: int | None) -> dict[str, Any]:
    """Serve's `max_replicas_per_node`, only when set (Serve takes no None for "no limit")."""
    return {} if limit is None else {"max_replicas_per_node": limit}


def _engine_deployment(model: ModelConfig, config: AppConfig, cls: type = EngineReplica) -> Deployment:
    dep = model.deployment
    serve_cap = dep.max_ongoing_requests + dep.max_queued_requests + _SERVE_SLACK
    if cls is ModelServer:
        # Every HTTP request reaches this replica (probes too), and refusing one in-process costs almost
        # nothing; a tight Serve cap would make the proxy queue them, then drop them as plain-text 503s.
        serve_cap = _HTTP_HEADROOM + serve_cap
    replicas: dict[str, Any] = {"num_replicas": dep.num_replicas}
    if dep.autoscaling is not None:  # the service's policy on the replicas' token demand (scaling/serve_policy.py)
        replicas = {"autoscaling_config": serve_autoscaling_config(dep.autoscaling, dep.ttft_target_s)}
    return serve.deployment(
        name=engine_deployment_name(model.id),
        **replicas,
        ray_actor_options={"num_cpus": dep.num_cpus, "num_gpus": dep.num_gpus},
        **_per_node(dep.max_replicas_per_node),
        max_ongoing_requests=serve_cap,
        max_queued_requests=serve_cap,
        health_check_period_s=dep.health_check_period_s,
        health_check_timeout_s=dep.health_check_timeout_s,
        graceful_shutdown_timeout_s=config.service.drain_grace_s,
        request_router_config=RequestRouterConfig(**_ROUTER),
    )(cls)


def colocated(config: AppConfig) -> bool:
    """One model on one replica (and `colocate_ingress`): that replica serves HTTP itself, with no hop per token.
    Several replicas get the ingress tier: it holds the client's connection apart from any engine replica, so a
    request nothing has been sent for yet is retried on another replica when one is full, dead or starting
    (`rayserve.handle_backend.HandleBackend`), and no request waits on a replica that cannot serve it."""
    one = len(config.models) == 1 and config.models[0].deployment.most_replicas == 1
    return config.service.colocate_ingress and one


def ingress_deployment_name(config: AppConfig) -> str:
    """The deployment that answers HTTP (and `drain`) for this config."""
    return engine_deployment_name(config.models[0].id) if colocated(config) else INGRESS_NAME


def build_from_config(config: AppConfig, listen: bool = False) -> serve.Application:
    """`listen`: the HTTP-facing replica (always one: the colocated engine replica, or the ingress) binds
    `service.host:port` itself; otherwise Serve's HTTP proxy answers HTTP (Serve configs, KubeRay). API keys are
    resolved here, in the process that builds the app, and reach every replica as digests in its config
    (api_keys.py); so is each engine's scheduling policy, which follows the tenants' priority classes."""
    config = config.with_resolved_keys().with_engine_policies()
    if colocated(config):
        model = config.models[0]
        return _engine_deployment(model, config, ModelServer).bind(config, listen)
    engines = {m.id: _engine_deployment(m, config).bind(m, config.service) for m in config.models}
    ingress = serve.deployment(
        name=INGRESS_NAME,
        num_replicas=1,
        ray_actor_options={"num_cpus": 0},
        max_ongoing_requests=10_000,  # the ingress only awaits; the engines bound the work
        # The ingress holds the clients' streams: a stopped ingress replica (a rolling update replaces it too)
        # lets each finish, which may take a request's whole time, continuations included. The engine
        # replicas' shorter grace is fine: what they cannot finish within it continues on another replica.
        graceful_shutdown_timeout_s=max(config.service.drain_grace_s, config.service.request_timeout_s),
    )(Ingress)
    return ingress.bind(config, engines, listen)


def config_from_args(args: dict[str, Any]) -> AppConfig:
    """`args` from a Serve config: either `config_path: <yaml file>` or `config: {inline config}`."""
    args = dict(args or {})
    unknown = set(args) - {"config_path", "config"}
    if unknown:
        raise ConfigError(f"build_app args has unknown keys {sorted(unknown)}; pass 'config_path' or 'config'")
    if ("config_path" in args) == ("config" in args):
        raise ConfigError(
            "build_app args needs exactly one of 'config_path' (a YAML file) or 'config' (the config inline)"
        )
    if "config_path" in args:
        return load_config(args["config_path"])
    return parse_config(args["config"], origin="build_app args 'config'")


def build_app(args: dict[str, Any]) -> serve.Application:
    return build_from_config(config_from_args(args))
