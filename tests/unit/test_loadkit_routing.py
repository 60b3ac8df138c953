"""The routing benchmark's arithmetic (loadkit/routing/): /metrics read per replica, deltas, pooled rows, the targets
judged as ratios to the power-of-two router of the same run."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loadkit.routing.drive import Outcome
from loadkit.routing.figures import Row, delta, scrape
from loadkit.routing.report import section, targets

METRICS = """# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m",replica="a"} 300.0
vllm:prefix_cache_hits_total{model_name="m",replica="b"} 100.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m",replica="a"} 600.0
vllm:prefix_cache_queries_total{model_name="m",replica="b"} 400.0
# TYPE vllm:prompt_tokens counter
vllm:prompt_tokens_total{model_name="m",replica="a"} 600.0
vllm:prompt_tokens_total{model_name="m",replica="b"} 400.0
# TYPE app_routed_predicted_cached_tokens counter
app_routed_predicted_cached_tokens_total{model_name="m",replica="a"} 256.0
# TYPE app_routed_confirmed_cached_tokens counter
app_routed_confirmed_cached_tokens_total{model_name="m",replica="a"} 128.0
# TYPE app_routing_decision_p99_seconds gauge
app_routing_decision_p99_seconds{model_name="m"} 0.0004
# TYPE app_routing_decision_cpu_p99_seconds gauge
app_routing_decision_cpu_p99_seconds{model_name="m"} 0.0001
"""


def _row(ttft: float, hits: float, queries: float, tokens: int = 32, wall: float = 10.0) -> Row:
    row = Row()
    row.add([Outcome(200, ttft, 2 * ttft, tokens)] * 10 + [Outcome(429)], wall,
            {"vllm:prefix_cache_hits": {"a": hits}, "vllm:prefix_cache_queries": {"a": queries},
             "vllm:prompt_tokens": {"a": queries * 0.6, "b": queries * 0.4}})
    return row


def test_metrics_are_read_per_replica_and_a_workload_counts_only_what_changed_during_it():
    before = scrape(METRICS)
    assert before["vllm:prefix_cache_hits"] == {"a": 300.0, "b": 100.0}
    assert before["app_routing_decision_p99_seconds"] == {"": 0.0004}
    assert before["app_routing_decision_cpu_p99_seconds"] == {"": 0.0001}
    after = scrape(METRICS.replace('replica="a"} 300.0', 'replica="a"} 500.0'))
    assert delta(before, after)["vllm:prefix_cache_hits"] == {"a": 200.0, "b": 0.0}
    row = Row()
    row.add([Outcome(200, 0.5, 1.0, 32)], 2.0, before)
    assert (row.hit_rate(), row.busiest_share(), row.precision(), row.decision_p99_s) == (0.4, 0.6, 0.5, 0.0004)
    assert row.tokens_per_s() == 16.0 and row.failed() == 0
    assert row.decision_cpu_p99_s == 0.0001


def test_the_targets_are_ratios_to_power_of_two_in_the_same_run():
    rows = {"W1": {"earliest_first_token": _row(0.2, 80, 100), "power_of_two": _row(0.5, 30, 100)},
            "W3": {"earliest_first_token": _row(0.5, 0, 100, wall=10.5), "power_of_two": _row(0.5, 0, 100)}}
    lines = targets(rows)
    assert "W1 TTFT p50, this router / power of two (target ≤ 0.5): 0.40× (met)" in lines[0]
    assert "(target ≥ 1.8): 2.67× (met)" in lines[1]
    assert "W3 output tokens/s" in lines[2] and "0.95× (NOT met)" in lines[2]
    text = section(rows, "header", ["earliest_first_token", "power_of_two"])
    assert "| W1 shared system prompts" in text and "| 11 | 1 |" in text and "80 %" in text


def test_the_decision_time_verdict_is_on_the_wall_time_and_names_the_cpu_time_beside_it():
    row = _row(0.2, 80, 100)
    row.add([], 0.0, {"app_routing_decision_p99_seconds": {"": 0.0025},
                      "app_routing_decision_cpu_p99_seconds": {"": 0.0002}})
    line = targets({"W1": {"earliest_first_token": row}})[-1]
    assert "2.50 ms (target < 2 ms: NOT met); on the deciding thread's CPU 0.20 ms" in line


def test_the_runs_service_reports_cached_tokens_in_usage():
    """drive.py reads usage's cached tokens, which the service (as `vllm serve`) reports only when turned on."""
    from app.config.app_config import parse_config
    from loadkit.routing.run import serve_config

    config = serve_config(8123, "power_of_two", 0.5)
    assert parse_config(config["applications"][0]["args"]["config"]).service.enable_prompt_tokens_details


def test_a_peer_without_counters_reads_its_hit_rate_from_the_answers_usage():
    row = Row()
    row.add([Outcome(200, 0.5, 1.0, 32, prompt_tokens=1000, cached_tokens=750),
             Outcome(200, 0.5, 1.0, 32, prompt_tokens=1000, cached_tokens=250), Outcome(503)], 2.0, {})
    assert row.hit_rate() == 0.5 and row.busiest_share() is None and row.precision() is None


def test_w4_is_also_judged_against_ray_s_prefix_router_as_shipped():
    rows = {"W4": {"earliest_first_token": _row(1.0, 0, 100), "power_of_two": _row(0.8, 0, 100),
                   "ray_prefix_router": _row(2.0, 0, 100)}}
    lines = targets(rows)
    assert "W4 TTFT p99, this router / power of two (target ≤ 1): 1.25× (NOT met)" in lines[0]
    assert "W4 TTFT p99, this router / Ray's prefix router as shipped (target ≤ 1): 0.50× (met)" in lines[1]


def test_ray_serve_llm_is_deployed_with_the_service_s_engine_settings_and_its_prefix_router():
    from loadkit.routing import ray_llm
    from loadkit.routing.run import serve_config

    ours = serve_config(8123, "power_of_two", 0.25)["applications"][0]["args"]["config"]["models"][0]["engine"]
    shipped = ray_llm.serve_config(8123, "llm", "m", "/models/m", ours, None)
    app = shipped["applications"][0]
    assert app["import_path"] == "ray.serve.llm:build_openai_app" and shipped["http_options"]["port"] == 8123
    llm = app["args"]["llm_configs"][0]
    kwargs = llm["engine_kwargs"]
    assert (kwargs["max_model_len"], kwargs["max_num_seqs"], kwargs["dtype"], kwargs["enforce_eager"]) == (
        ours["max_model_len"], ours["max_num_seqs"], ours["dtype"], ours["enforce_eager"])
    assert kwargs["kv_cache_memory_bytes"] == 2**28 and kwargs["enable_prompt_tokens_details"]
    router = llm["deployment_config"]["request_router_config"]
    assert router == {"request_router_class": ray_llm.ROUTER}  # as shipped: no load fallback
    assert llm["placement_group_config"] == {"bundles": [{"CPU": 1}]} and llm["deployment_config"]["num_replicas"] == 2
    assert llm["deployment_config"]["ray_actor_options"] == {"num_cpus": 0}  # the bundle stays one CPU: one a node
    balanced = ray_llm.serve_config(8123, "llm", "m", "/models/m", ours, 2)
    assert balanced["applications"][0]["args"]["llm_configs"][0]["deployment_config"]["request_router_config"][
        "request_router_kwargs"] == {"imbalanced_threshold": 2}


def test_vllm_router_fronts_two_bare_vllm_servers_with_the_service_s_engine_settings():
    from loadkit.routing import vllm_router
    from loadkit.routing.run import SYSTEMS, serve_config

    ours = serve_config(8123, "power_of_two", 0.25)["applications"][0]["args"]["config"]["models"][0]["engine"]
    command = vllm_router.server_command(9001, "m", "/models/m", ours)
    flag = {a: command[i + 1] for i, a in enumerate(command[:-1]) if a.startswith("--")}
    assert command[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert (flag["--model"], flag["--served-model-name"], flag["--port"]) == ("/models/m", "m", "9001")
    assert (flag["--max-model-len"], flag["--max-num-seqs"], flag["--dtype"]) == (
        str(ours["max_model_len"]), str(ours["max_num_seqs"]), ours["dtype"])
    assert flag["--kv-cache-memory-bytes"] == str(2**28)
    assert "--enforce-eager" in command and "--enable-prompt-tokens-details" in command
    router = vllm_router.router_command(8123, ["http://127.0.0.1:9001", "http://127.0.0.1:9002"])
    assert router[router.index("--policy") + 1] == "cache_aware" and router[router.index("--port") + 1] == "8123"
    assert router[router.index("--worker-urls") + 1:][:2] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]
    assert vllm_router.SYSTEM in SYSTEMS


def test_the_bare_servers_counters_are_read_one_replica_per_server(monkeypatch: pytest.MonkeyPatch, tmp_path):
    from loadkit.routing import vllm_router

    texts = iter([
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 128.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 256.0\n',
        'vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0\n'
        'vllm:prefix_cache_queries_total{engine="0",model_name="m"} 100.0\n',
    ])

    class Answer:
        def __init__(self, text: str):
            self.text = text

    monkeypatch.setattr(vllm_router.httpx, "get", lambda url, timeout: Answer(next(texts)))
    fleet = vllm_router.VllmRouterFleet(8123, "m", "/models/m", {}, tmp_path)
    fleet.servers = [SimpleNamespace(base_url=f"http://127.0.0.1:{port}") for port in (1, 2)]
    counters = fleet.metrics()
    assert counters["vllm:prefix_cache_hits"] == {"vllm-0": 128.0, "vllm-1": 0.0}
    assert counters["vllm:prefix_cache_queries"] == {"vllm-0": 256.0, "vllm-1": 100.0}


def test_every_engine_holds_w1s_tokens_alike_whatever_this_cpus_precision(monkeypatch: pytest.MonkeyPatch):
    """On an AMX Xeon the service's `auto` runs float32, where 0.25 GiB holds half the tokens it holds in bfloat16 and
    W1's prefixes no longer fit two caches; the peers get that precision too, not bare vLLM's own `auto`."""
    from loadkit.routing import run

    assert run.cache_gib("bfloat16") == 0.25 and run.cache_gib("float32") == 0.5
    monkeypatch.setattr(run, "same_precision", lambda dtype: "float32" if dtype == "auto" else dtype)
    engine = run._engine(SimpleNamespace(kv_cache_gib=0.5, dtype=run.service_dtype()))
    assert engine["dtype"] == "float32" and engine["kv_cache_gib"] == 0.5
