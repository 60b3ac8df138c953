"""The `app-cluster` benchmark system's pure parts: the manifest's serveConfigV2 made benchmark-ready (only the
proxy's address, the shared engine settings and open admission change), the engine replicas' log lines read into
start-up times and per-replica shares, and the report's section built from them."""

from __future__ import annotations

import json
from pathlib import Path

from loadkit.bench.cluster import (
    Share,
    cluster_section,
    fractions,
    imbalance,
    json_lines,
    observed,
    pooled,
    shares,
    startup_seconds,
)
from loadkit.bench.results import Row, SystemRun
from loadkit.peers import (
    ENGINE_DEPLOYMENT,
    INGRESS_DEPLOYMENT,
    MANIFEST,
    Engine,
    bench_serve_config,
    changes,
    manifest_serve_config,
    replicas_in,
)
from loadkit.stats import PooledFigures

REPO = Path(__file__).resolve().parents[2]
PREFIX = "bench-app-cluster-float32-c16-r0-"


def _manifest() -> dict:
    return manifest_serve_config((REPO / MANIFEST).read_text())


def test_the_manifest_config_changes_only_where_the_proxy_listens_the_engine_settings_and_admission():
    manifest = _manifest()
    kept = json.dumps(manifest, sort_keys=True)
    config = bench_serve_config(manifest, 45555, 64, 128, Engine(dtype="float32"))
    assert json.dumps(manifest, sort_keys=True) == kept, "the manifest's config was modified in place"
    assert config["http_options"]["host"] == "127.0.0.1" and config["http_options"]["port"] == 45555
    changed = {c.split(":", 1)[0] for c in changes(manifest, config)}
    model = "applications[llm].args.config.models[smollm2-135m-instruct]"
    allowed = {"http_options.host", "http_options.port", "applications[llm].args.config.service.api_keys",
               "applications[llm].args.config.service.request_timeout_s",
               "applications[llm].args.config.service.drain_grace_s",
               *(f"{model}.engine.{k}" for k in ("enforce_eager", "dtype", "max_model_len", "max_num_seqs",
                                                 "kv_cache_gib")),
               *(f"{model}.deployment.{k}" for k in ("max_ongoing_requests", "max_queued_requests", "ttft_target_s")),
               f"{model}.limits.max_tokens"}
    assert changed <= allowed, changed - allowed
    assert f"{model}.engine.dtype" in changed  # the manifest's `auto` becomes the precision asked for
    # The topology is the manifest's: separate ingress tier, two engine replicas at most one per node, two ingress.
    app = config["applications"][0]
    assert app["args"]["config"]["service"].get("colocate_ingress") == \
        manifest["applications"][0]["args"]["config"]["service"].get("colocate_ingress")
    assert app["deployments"] == manifest["applications"][0]["deployments"]
    assert replicas_in(config, ENGINE_DEPLOYMENT) == 2


def test_replicas_in_reads_the_deployments_override():
    config = {"applications": [{"deployments": [{"name": "ingress", "num_replicas": 3},
                                                {"name": "engine-x", "max_replicas_per_node": 1}]}]}
    assert replicas_in(config, INGRESS_DEPLOYMENT) == 3
    assert replicas_in(config, "engine-x") == 1  # no num_replicas in the override: Serve's default
    assert replicas_in({"applications": [{}]}, "engine-x") == 1


def test_changes_lists_added_removed_and_changed_leaves():
    assert changes({"a": {"b": 1, "c": 2}}, {"a": {"b": 1, "c": 3, "d": None}}) == [
        "a.c: 2 -> 3", "a.d: (unset) -> null"]
    assert changes({"l": [{"name": "x", "v": 1}]}, {"l": [{"name": "x", "v": 2}]}) == ["l[x].v: 1 -> 2"]


def _line(**kw) -> str:
    return json.dumps({"ts": 1.0, "logger": "app.server", **kw})


def _engine_log(node_tokens: list[int], ready_s: float = 41.5, warmups: int = 2) -> str:
    lines = ["2026-12-01 INFO vLLM plain line", "{not json", _line(message=f"model smollm2 ready in {ready_s} s; "
                                                                         "token budget 43690")]
    lines += [_line(message="engine request", trace_id="a1b2", generated_tokens=128, outcome="finished")
              for _ in range(warmups)]  # warm-ups carry no X-Request-Id: a random trace id
    lines += [_line(message="engine request", trace_id=f"{PREFIX}{i}", generated_tokens=t, outcome="finished")
              for i, t in enumerate(node_tokens)]
    lines.append(_line(message="engine request", trace_id="bench-app-cluster-float32-c64-r0-0", generated_tokens=5,
                       outcome="finished"))
    return "\n".join(lines)


def test_start_up_and_shares_come_from_the_replicas_own_lines():
    one, two = json_lines(_engine_log([128] * 30)), json_lines(_engine_log([128] * 33 + [64], ready_s=38.0))
    assert startup_seconds(one) == 41.5 and startup_seconds(two) == 38.0
    assert startup_seconds(json_lines(_line(message="engine request"))) is None
    parts = shares({"worker-2": two, "worker-1": one}, PREFIX)
    assert parts == [Share("worker-1", 30, 3840, 0), Share("worker-2", 34, 4288, 0)]  # warm-ups and c=64 left out
    (n1, r1, t1), (n2, r2, t2) = fractions(parts)
    assert (n1, n2) == ("worker-1", "worker-2")
    assert abs(r1 - 30 / 64) < 1e-9 and abs(t2 - 4288 / 8128) < 1e-9
    assert abs(imbalance(parts) - 4288 / 4064) < 1e-9
    assert imbalance([Share("worker-1", 0, 0)]) is None


def test_rounds_pool_per_node():
    assert pooled([[Share("worker-1", 3, 30, 1), Share("worker-2", 5, 50)],
                   [Share("worker-2", 1, 10), Share("worker-1", 2, 20)]]) == [
        Share("worker-1", 5, 50, 1), Share("worker-2", 6, 60, 0)]


def test_observed_reads_each_engine_replicas_worker_files(tmp_path: Path):
    (tmp_path / "worker-aa-01000000-111.err").write_text(_engine_log([128] * 3))
    (tmp_path / "worker-bb-01000000-222.err").write_text(_engine_log([128] * 5, ready_s=12.0))
    (tmp_path / "worker-cc-01000000-333.err").write_text(_line(message="ingress ready"))
    facts = {"logs_dir": str(tmp_path), "deploy_to_ready_s": 80.0, "cluster_up_s": 20.0, "replicas": [
        {"deployment": ENGINE_DEPLOYMENT, "replica_id": "r1", "node": "worker-1", "pid": 111},
        {"deployment": ENGINE_DEPLOYMENT, "replica_id": "r2", "node": "worker-2", "pid": 222},
        {"deployment": INGRESS_DEPLOYMENT, "replica_id": "i1", "node": "head", "pid": 333}]}
    seen = observed(facts, {16: PREFIX})
    assert [(e["node"], e["startup_s"]) for e in seen["engines"]] == [("worker-1", 41.5), ("worker-2", 12.0)]
    assert seen["shares"] == [{"concurrency": 16, "shares": [
        {"node": "worker-1", "requests": 3, "tokens": 384, "failed": 0},
        {"node": "worker-2", "requests": 5, "tokens": 640, "failed": 0}]}]


def _run(system: str, tok_s: float, clusters: list[dict] | None = None) -> SystemRun:
    rows = [Row(system=system, dtype="float32", concurrency=16, num_prompts=64, input_len=128, output_len=128,
                peak_rss_bytes=2**30, load_command="x", status="ok",
                figures=PooledFigures(repeats=1, completed=64, duration_s=10, output_tok_s=tok_s, req_s=1.0,
                                      output_tok_s_runs=[tok_s]))]
    return SystemRun(system=system, dtype="float32", port=1, command=["x"], log_path="l", status="ok", rows=rows,
                     clusters=clusters or [])


def test_the_report_section_quotes_timings_shares_and_throughput_per_replica():
    facts = {"cluster_up_s": 21.0, "deploy_to_ready_s": 95.4, "config_changes": ["http_options.port: 8000 -> 1"],
             "replicas": [{"deployment": "ingress", "node": "head"}, {"deployment": "ingress", "node": "worker-1"}],
             "engines": [{"node": "worker-1", "startup_s": 40.2}, {"node": "worker-2", "startup_s": 44.9}],
             "shares": [{"concurrency": 16, "shares": [{"node": "worker-1", "requests": 32, "tokens": 4096},
                                                        {"node": "worker-2", "requests": 32, "tokens": 4096}]}]}
    cluster = _run("app-cluster", 600.0, [facts])
    assert cluster_section([_run("vllm", 400.0)]) == []
    cluster = SystemRun.from_dict(json.loads(json.dumps(cluster.to_dict())))  # through results.json
    text = "\n".join(cluster_section([_run("app-proxy", 360.0), cluster, _run("vllm", 400.0)]))
    assert "| 0 | 21 | 95 | worker-1 40, worker-2 45 | head, worker-1 |" in text
    assert "| 16 | worker-1 | 32 | 50.0% | 4096 | 50.0% | 0 | 1.000 |" in text
    assert "`http_options.port: 8000 -> 1`" in text
    assert "| 16 | 2 | 600.0 | 300.0 | 1.50× | 0.75× |" in text  # total and per replica over bare vLLM
    assert "| 16 | 1 | 360.0 | 360.0 | 0.90× | 0.90× |" in text
