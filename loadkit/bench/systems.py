"""The systems the benchmark compares, at a precision each: what they are called and how each one is started.

Identical engine settings for every vLLM-based system (enforce_eager, max_model_len 2048, max_num_seqs 64,
KV cache 2 GiB, one engine replica); only the precision varies, and every vLLM-based system runs at each one
asked for. The naive baseline is not a vLLM engine: it runs once, at the first precision asked for.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from loadkit.service import child_env

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
    """configs/cpu.yaml with only what the benchmark needs changed (`dtype: auto` passed through as it is).
    `shipped_admission`: the config's own admission and request timeout are kept (an overload benchmark measures
    them); otherwise admission is opened up so that it never refuses during a throughput benchmark."""
    config = yaml.safe_load((repo / "configs" / "cpu.yaml").read_text())
    service = config.setdefault("service", {})
    service.update({"host": "127.0.0.1", "port": port, "api_keys": [], "drain_grace_s": 5,
                    "colocate_ingress": colocate})
    model = config["models"][0]
    model["id"] = MODEL_ID
    model["source"] = "default"
    model.setdefault("engine", {}).update({
        "enforce_eager": engine.enforce_eager, "dtype": engine.dtype, "max_model_len": engine.max_model_len,
        "max_num_seqs": engine.max_num_seqs, "kv_cache_gib": engine.kv_cache_gib})
    model.setdefault("deployment", {})["num_replicas"] = 1
    if not shipped_admission:
        service["request_timeout_s"] = 3600
        model["deployment"].update({
            "max_ongoing_requests": max(64, max_concurrency),  # admission must not refuse during the benchmark
            "max_queued_requests": 64,
            "ttft_target_s": None})  # by count or by time: a closed-loop throughput run measures the engine
    limits = model.setdefault("limits", {})
    limits["max_tokens"] = max(int(limits.get("max_tokens", 1024)), output_len)
    config["models"] = [model]
    path = work / f"app-bench-{engine.dtype}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


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


def system_command(v: Variant, port: int, at: Launchable) -> list[str]:
    py, repo, engine = sys.executable, at.repo, replace(at.engine, dtype=v.dtype)
    served = ["--model", at.model_dir, "--served-model-name", MODEL_ID]
    listen = ["--host", "127.0.0.1", "--port", str(port)]
    if v.system == "app-cluster":
        from loadkit.bench.cluster_config import write_cluster_config  # it imports this module

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
    path = os.pathsep.join([str(repo), *filter(None, [os.environ.get("PYTHONPATH")])])
    return child_env(drop=("RAY_ADDRESS", "APP_API_KEYS", "OPENAI_API_KEY"),
                     VLLM_CPU_KVCACHE_SPACE=str(engine.kv_cache_gib), PYTHONUNBUFFERED="1", PYTHONPATH=path)
