"""The systems a comparison starts, each at a precision: this project (and its topologies) and its peers, bare
vLLM, Ray Serve LLM and the naive baseline; what each is called and how each is started.

Every vLLM-based system gets the same engine settings (`Engine`: enforce_eager, max_model_len 2048, max_num_seqs
64, KV cache 2 GiB, one engine replica); only the precision varies. The naive baseline is not a vLLM engine: it
runs once, at the first precision asked for. `start` runs one variant as a `Server`; `launch` is one start of it
in a round of a comparison, from its start-up to a stop that leaves nothing behind, kept as a `Launch`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import yaml

from loadkit.precision import resolved_dtype
from loadkit.service import Server, child_env, derive_config, free_port, pythonpath, write_config

MODEL_ID = "smollm2-135m-instruct"
SYSTEMS = ("app", "app-proxy", "app-ingress", "app-cluster", "vllm", "ray-llm", "naive")
DEFAULT_SYSTEMS = ("app", "vllm", "ray-llm", "naive")  # the ones the targets compare; `--systems all` for every one
VLLM_BASED = ("app", "app-proxy", "app-ingress", "app-cluster", "vllm", "ray-llm")
LABELS = {
    "app": "this project",
    "app-proxy": "this project, via Serve proxy",
    "app-ingress": "this project, separate ingress",
    "app-cluster": "this project, 2 replicas on 2 nodes behind Serve's proxy",
    "vllm": "bare vLLM",
    "ray-llm": "Ray Serve LLM",
    "naive": "naive baseline",
}
DESCRIPTIONS = {
    "app": "`python -m app serve` (Ray Serve replica hosting a vLLM AsyncLLM, FastAPI ingress with admission "
           "control; with one replica, the replica listens on the port itself)",
    "app-proxy": "the same with `--serve-proxy`: HTTP through Ray Serve's proxy actor, every streamed chunk crossing "
                 "a Ray call (the KubeRay path; the 'before' of the replica listening itself)",
    "app-ingress": "the same with `service.colocate_ingress: false`: a separate ingress deployment, tokens cross a "
                   "Ray handle (the multi-model topology; the 'before' of colocation)",
    "app-cluster": "`benchmarks/app_cluster.py`: a local multi-node Ray cluster (`python -m app cluster up`'s: a "
                   "head and 2 worker nodes, each confined to its own core), the KubeRay CPU manifest's own "
                   "serveConfigV2 deployed with `serve deploy`: Serve's proxy, 2 ingress replicas, 2 engine replicas "
                   "one per worker node (the KubeRay path with two replicas; see 'Multi-replica topology')",
    "vllm": "`python -m vllm.entrypoints.openai.api_server` (vLLM's own OpenAI server, same install)",
    "ray-llm": "`benchmarks/ray_serve_llm.py` (`ray.serve.llm.build_openai_app`, Ray's OpenAI-compatible LLM app)",
    "naive": "`benchmarks/naive_fastapi.py` (FastAPI + transformers `generate` per request, `asyncio.Semaphore(2)`; "
             "a baseline, not part of app/)",
}
# The naive baseline computes with as many threads as vLLM's CPU engine does: vLLM reserves one core for its
# front end and computes on the rest. (Two concurrent generate() calls with torch's default thread count
# oversubscribe the cores; on a busy 2-core machine that showed multi-second stalls between tokens.)
NAIVE_THREADS = max(1, (os.cpu_count() or 2) - 1)


@dataclass(frozen=True)
class Engine:
    """The engine settings every vLLM-based system gets; `dtype` is set per variant."""

    enforce_eager: bool = True
    dtype: str = "bfloat16"
    max_model_len: int = 2048
    max_num_seqs: int = 64
    kv_cache_gib: int = 2


def config_dtype(repo: Path) -> str:
    """The precision of configs/cpu.yaml's first model: the benchmark's default, as the service's own."""
    config = yaml.safe_load((repo / "configs" / "cpu.yaml").read_text())
    return str((config["models"][0].get("engine") or {}).get("dtype", "auto"))


@dataclass(frozen=True)
class Variant:
    """One system at one precision: a row group of the report."""

    system: str
    dtype: str

    @property
    def key(self) -> str:
        return f"{self.system}@{self.dtype}"

    @property
    def label(self) -> str:
        return LABELS[self.system]


def variants(systems: list[str], dtypes: list[str]) -> list[Variant]:
    """Every vLLM-based system at every precision; the naive baseline once, at the first."""
    out = []
    for system in systems:
        for dtype in (dtypes if system in VLLM_BASED else dtypes[:1]):
            out.append(Variant(system, dtype))
    return out


def write_app_config(repo: Path, work: Path, port: int, max_concurrency: int, output_len: int, engine: Engine,
                     colocate: bool = True, shipped_admission: bool = False) -> Path:
    """configs/cpu.yaml with only what the comparison needs changed (`dtype: auto` passed through as it is).
    `shipped_admission`: the config's own admission and request timeout are kept (an overload benchmark measures
    them); otherwise admission is opened up so that it never refuses during a throughput benchmark."""
    opened = {} if shipped_admission else {
        "max_ongoing_requests": max(64, max_concurrency),  # admission must not refuse during the benchmark
        "max_queued_requests": 64,
        "ttft_target_s": None}  # by count or by time: a closed-loop throughput run measures the engine
    config = derive_config(
        repo / "configs" / "cpu.yaml", port,
        service={"drain_grace_s": 5, "colocate_ingress": colocate,
                 **({} if shipped_admission else {"request_timeout_s": 3600})},
        model={"id": MODEL_ID, "source": "default"},
        engine={"enforce_eager": engine.enforce_eager, "dtype": engine.dtype, "max_model_len": engine.max_model_len,
                "max_num_seqs": engine.max_num_seqs, "kv_cache_gib": engine.kv_cache_gib},
        deployment={"num_replicas": 1, **opened})
    limits = config["models"][0].setdefault("limits", {})
    limits["max_tokens"] = max(int(limits.get("max_tokens", 1024)), output_len)
    config["models"] = config["models"][:1]
    return write_config(config, work / f"app-bench-{engine.dtype}.yaml")


@dataclass(frozen=True)
class Launchable:
    """Where a variant's command is built: the repo, the model folder, the work folder, the load's extremes."""

    repo: Path
    model_dir: str
    work: Path
    max_concurrency: int
    max_output_len: int
    engine: Engine
    ray_stream_batching_ms: float | None = None
    shipped_admission: bool = False  # this project keeps configs/cpu.yaml's admission (see write_app_config)


def cluster_facts_path(work: Path, port: int) -> Path:
    """Where benchmarks/app_cluster.py writes the facts of the launch on `port` (its nodes, replicas, timings)."""
    return work / f"app-cluster-{port}.cluster.json"


# -- the `app-cluster` system's Serve config -----------------------------------------------------------------------
# The KubeRay CPU manifest's own serveConfigV2 with only what the comparison's rules require changed: where Serve's
# proxy listens (loopback and the harness's port, as a pod's network gives 0.0.0.0:8000), the engine settings every
# vLLM-based system gets, and the admission the `app` system gets. Kept as the manifest has them: the separate
# ingress tier, the `deployments` override (two engine replicas, at most one per node; two ingress replicas),
# `num_cpus`, and everything else.

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
    return write_config(bench_serve_config(manifest, port, max_concurrency, output_len, engine),
                        work / f"app-cluster-serve-{engine.dtype}-{port}.yaml")


def system_command(v: Variant, port: int, at: Launchable) -> list[str]:
    py, repo, engine = sys.executable, at.repo, replace(at.engine, dtype=v.dtype)
    served = ["--model", at.model_dir, "--served-model-name", MODEL_ID]
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    if v.system == "app-cluster":
        config = write_cluster_config(repo, at.work, port, at.max_concurrency, at.max_output_len, engine)
        return [py, str(repo / "benchmarks" / "app_cluster.py"), "--serve-config", str(config),
                "--facts", str(cluster_facts_path(at.work, port))]
    if v.system in ("app", "app-proxy", "app-ingress"):
        config = write_app_config(repo, at.work, port, at.max_concurrency, at.max_output_len, engine,
                                  colocate=v.system != "app-ingress", shipped_admission=at.shipped_admission)
        proxy = ["--serve-proxy"] if v.system == "app-proxy" else []
        return [py, "-m", "app", "serve", "--config", str(config), *proxy]
    sizes = ["--dtype", engine.dtype, "--max-model-len", str(engine.max_model_len),
             "--max-num-seqs", str(engine.max_num_seqs)]
    if v.system == "vllm":
        return [py, "-m", "vllm.entrypoints.openai.api_server", *served, "--enforce-eager", *sizes, *listen]
    if v.system == "ray-llm":
        extra = [] if at.ray_stream_batching_ms is None else ["--stream-batching-ms", str(at.ray_stream_batching_ms)]
        return [py, str(repo / "benchmarks" / "ray_serve_llm.py"), *served, *sizes, *extra, *listen]
    if v.system == "naive":
        return [py, str(repo / "benchmarks" / "naive_fastapi.py"), *served, "--dtype", engine.dtype,
                "--threads", str(NAIVE_THREADS), *listen]
    raise ValueError(v.system)



def system_env(repo: Path, engine: Engine) -> dict[str, str]:
    """A system's environment: no one else's Ray or keys, the KV cache size, and the kit importable for the
    peers in benchmarks/ (which reap with it) even before a reinstall."""
    return child_env(drop=("RAY_ADDRESS", "APP_API_KEYS", "OPENAI_API_KEY"),
                     VLLM_CPU_KVCACHE_SPACE=str(engine.kv_cache_gib), PYTHONUNBUFFERED="1", PYTHONPATH=pythonpath(repo))


def start(v: Variant, at: Launchable, log_path: Path) -> Server:
    """`v` started on a free port, its whole tree's peak RSS sampled; `Server.stop` leaves nothing behind."""
    port = free_port()
    return Server(system_command(v, port, at), port=port, log_path=log_path, cwd=at.repo,
                  env=system_env(at.repo, at.engine), sample_peak=True)


@dataclass
class Launch:
    """One start of one variant in one round of a comparison, as its results keep it."""

    system: str
    round: int
    command: list[str]
    log_path: str
    dtype: str = ""
    port: int = 0
    status: str = "not run"  # ok | failed to start: ... | what ended it early
    startup_s: float | None = None
    idle_rss_bytes: int | None = None
    resolved_dtype: str | None = None  # what the engine said it computes in (what `auto` became)
    stop_report: str = ""


L = TypeVar("L", bound=Launch)


def launch(v: Variant, at: Launchable, log_path: Path, round_: int, kind: type[L], drive: Callable[[Server, L], None],
           *, startup_timeout_s: float, stop_grace_s: float, say: Callable[[str], None]) -> L:
    """Starts `v`; once it answers (a chat completion succeeded) notes its start-up time, idle RSS and engine
    dtype and runs `drive(server, launch)`; then stops it, leaving nothing behind, whatever happened. A system
    that cannot start (a peer's import error, a crash while loading) ends its launch with a status that says why,
    with its log's last error line."""
    server = start(v, at, log_path)
    out = kind(system=v.system, round=round_, command=server.command, log_path=str(log_path), dtype=v.dtype,
               port=server.port)
    say(f"{v.key}: round {round_}: started on port {server.port}: {shlex.join(server.command)}")
    try:
        why = server.wait_ready(startup_timeout_s, MODEL_ID)
        if why:
            out.status = f"failed to start: {why}"
            say(f"{v.key}: {out.status}\n--- log tail ---\n{server.log_tail(2000)}\n---")
            return out
        out.startup_s = time.monotonic() - server.started
        out.idle_rss_bytes = server.sampler.sample()
        out.resolved_dtype = resolved_dtype(server.log_tail(200_000))
        out.status = "ok"
        say(f"{v.key}: ready in {out.startup_s:.0f} s, {out.idle_rss_bytes / 2**30:.2f} GiB RSS"
            + (f", engine dtype {out.resolved_dtype}" if out.resolved_dtype else ""))
        drive(server, out)
        return out
    finally:
        out.stop_report = server.stop(stop_grace_s).text()
        say(f"{v.key}: {out.stop_report}")
