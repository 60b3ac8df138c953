"""The `app-cluster` system's Serve config: the KubeRay CPU manifest's own serveConfigV2, read from the manifest
file, with only what the benchmark's rules require changed, and the list of those changes for the report.

Changed: where Serve's proxy listens (loopback and the harness's port, as a pod's network gives 0.0.0.0:8000);
the engine settings every vLLM-based system gets (systems.Engine); and the admission the `app` system gets
(opened up so it never refuses during a throughput run, as systems.write_app_config does). Kept as the manifest
has them: the separate ingress tier (`colocate_ingress`), the `deployments` override (two engine replicas, at
most one per node; two ingress replicas), `num_cpus`, and everything else.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from loadkit.bench.systems import MODEL_ID, Engine

MANIFEST = Path("configs") / "kuberay" / "rayservice-cpu.yaml"
APP_NAME = "llm"  # the manifest's application
INGRESS_DEPLOYMENT = "ingress"
# app.rayserve.builder.engine_deployment_name(MODEL_ID); the kit imports nothing from app/.
ENGINE_DEPLOYMENT = "engine-" + MODEL_ID


def manifest_serve_config(manifest_text: str) -> dict[str, Any]:
    """The serveConfigV2 of a RayService manifest, as data."""
    return yaml.safe_load(yaml.safe_load(manifest_text)["spec"]["serveConfigV2"])


def bench_serve_config(serve_config: dict[str, Any], port: int, max_concurrency: int, output_len: int,
                       engine: Engine) -> dict[str, Any]:
    """A copy of `serve_config` (one application, one model) with the benchmark's changes; the input is kept."""
    config = json.loads(json.dumps(serve_config))
    config["http_options"] = {**config.get("http_options", {}), "host": "127.0.0.1", "port": port}
    app_config = config["applications"][0]["args"]["config"]
    service = app_config.setdefault("service", {})
    service.update({"api_keys": [], "request_timeout_s": 3600, "drain_grace_s": 5})
    model = app_config["models"][0]
    model.setdefault("engine", {}).update({
        "enforce_eager": engine.enforce_eager, "dtype": engine.dtype, "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs, "kv_cache_gib": engine.kv_cache_gib})
    model.setdefault("deployment", {}).update({
        "max_ongoing_requests": max(64, max_concurrency),  # per replica: admission must not refuse here either
        "max_queued_requests": 64,
        "ttft_target_s": None})
    limits = model.setdefault("limits", {})
    limits["max_tokens"] = max(int(limits.get("max_tokens", 1024)), output_len)
    return config


def _leaves(value: Any, path: str = "") -> dict[str, Any]:
    if isinstance(value, dict) and value:
        out: dict[str, Any] = {}
        for key, inner in value.items():
            out.update(_leaves(inner, f"{path}.{key}" if path else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
        out = {}
        for i, inner in enumerate(value):
            name = inner.get("name", inner.get("id", i))
            out.update(_leaves(inner, f"{path}[{name}]"))
        return out
    return {path: value}


def changes(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """'key: old -> new' for every leaf that differs (missing: '(unset)'), keys as dotted paths."""
    old, new = _leaves(before), _leaves(after)
    out = []
    for key in sorted(old.keys() | new.keys()):
        if old.get(key, "(unset)") != new.get(key, "(unset)"):
            out.append(f"{key}: {json.dumps(old.get(key, '(unset)'))} -> {json.dumps(new.get(key, '(unset)'))}")
    return [c.replace('"(unset)"', "(unset)") for c in out]


def replicas_in(serve_config: dict[str, Any], deployment: str) -> int:
    """How many replicas the config's `deployments` override gives `deployment` (1 without one)."""
    for d in serve_config["applications"][0].get("deployments") or []:
        if d.get("name") == deployment and "num_replicas" in d:
            return int(d["num_replicas"])
    return 1


def write_cluster_config(repo: Path, work: Path, port: int, max_concurrency: int, output_len: int,
                         engine: Engine) -> Path:
    """The config `serve deploy` sends, written beside the run's raw results; returns its path."""
    manifest = manifest_serve_config((repo / MANIFEST).read_text())
    path = work / f"app-cluster-serve-{engine.dtype}-{port}.yaml"
    path.write_text(yaml.safe_dump(bench_serve_config(manifest, port, max_concurrency, output_len, engine),
                                   sort_keys=False))
    return path
