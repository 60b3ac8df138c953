"""The routing benchmark's peer: Ray Serve LLM 2.60 (`ray.serve.llm:build_openai_app`) with Ray's own
`PrefixCacheAffinityRouter`, deployed with `serve deploy` onto the same local cluster as the service.

Two engine replicas of the same model folder with the engine settings and KV cache the service's replicas get (from
the KubeRay manifest's model config), one per worker node: each asks for a placement bundle of one CPU (on the CPU
its engine otherwise asks for a GPU) and its replica actor for none (Ray Serve LLM adds the actor's CPU to that
bundle: two CPUs, which no one-core worker node has), and the head node has none. Its ingress sits on the head like
the service's (the cluster's `ingress` resource, no CPU). Ray's router matches the request's text (prompt or
messages) in a prefix tree; as shipped its load fallback is off (`imbalanced_threshold` infinite), and
`ray_prefix_router_balanced` turns it on. The
engines report their cached tokens in `usage` (vLLM's `enable_prompt_tokens_details`), from which the run reads
their hit rate: this app has no /metrics of vLLM's counters at its HTTP port.
"""

from __future__ import annotations

from typing import Any

ROUTER = "ray.serve.llm.request_router.PrefixCacheAffinityRouter"
# The load fallback: prefix matching only while the replicas' queues differ by less than this many requests. Two
# lets a replica two requests ahead lose its prefixes to the other (runs keep four requests in flight).
BALANCED_THRESHOLD = 2
# system name -> the router's imbalanced_threshold (None: as shipped)
PEERS: dict[str, int | None] = {"ray_prefix_router": None, "ray_prefix_router_balanced": BALANCED_THRESHOLD}
BUILDER = "ray.serve.llm:build_openai_app"


def serve_config(port: int, app_name: str, model_id: str, model_dir: str, engine: dict[str, Any],
                 imbalanced_threshold: int | None) -> dict[str, Any]:
    """A Serve config deploying Ray Serve LLM as `app_name` at `port`, `engine` the service's engine settings (its
    KV cache included)."""
    engine_kwargs = {"max_model_len": engine["max_model_len"], "max_num_seqs": engine["max_num_seqs"],
                     "dtype": engine.get("dtype", "auto"), "enforce_eager": engine.get("enforce_eager", True),
                     "kv_cache_memory_bytes": int(engine["kv_cache_gib"] * 2**30), "enable_prompt_tokens_details": True}
    router: dict[str, Any] = {"request_router_class": ROUTER}
    if imbalanced_threshold is not None:
        router["request_router_kwargs"] = {"imbalanced_threshold": imbalanced_threshold}
    llm = {"model_loading_config": {"model_id": model_id, "model_source": model_dir},
           "engine_kwargs": engine_kwargs,
           "placement_group_config": {"bundles": [{"CPU": 1}]},
           "deployment_config": {"num_replicas": 2, "request_router_config": router,
                                 "ray_actor_options": {"num_cpus": 0}}}
    ingress = {"num_replicas": 1, "ray_actor_options": {"num_cpus": 0, "resources": {"ingress": 0.01}}}
    return {"proxy_location": "HeadOnly", "http_options": {"host": "127.0.0.1", "port": port},
            "applications": [{"name": app_name, "route_prefix": "/", "import_path": BUILDER,
                              "args": {"llm_configs": [llm], "ingress_deployment_config": ingress}}]}
