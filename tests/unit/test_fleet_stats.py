"""Operators see every replica (issue 27): /metrics labels each replica's figures and says which did not answer;
/stats gives each model's single figure (`host.stats.combined`) beside every replica's. Before, both read one
replica chosen by the router per scrape: a broken replica's health, wedges and restarts could never show."""

from __future__ import annotations

from dataclasses import replace

from app.engine.engine_stats import EngineStats
from app.host.stats import AdmissionStats, ReplicaStats, combined
from app.http.metrics import Metrics


def _stats(running: int, healthy: bool = True, wedged: int = 0, kv: float = 0.5) -> ReplicaStats:
    return ReplicaStats(
        model="m", ready=True, healthy=healthy, kv_cache_tokens=1000, wedged_total=wedged,
        engine=EngineStats(running=running, kv_cache_usage=kv, generation_tokens_total=10 * running),
        admission=AdmissionStats(running=running, waiting=1, in_system=running + 1, tokens_in_use=5, token_budget=100,
                                 peak_waiting=2, refused_queue_full=1, refused_queue_timeout=0,
                                 refused_over_time_target=3, predicted_first_token_s=0.5 * running or None))


def test_every_replica_is_reported_labelled_and_one_that_did_not_answer_is_reported_down():
    text = Metrics().render({"m": {"r1": _stats(2), "r2": _stats(0, healthy=False, wedged=1), "r3": None}}).decode()
    assert 'app_engine_healthy{model_name="m",replica="r1"} 1.0' in text
    assert 'app_engine_healthy{model_name="m",replica="r2"} 0.0' in text  # broken, and shown broken
    assert 'app_engine_wedged_total{model_name="m",replica="r2"} 1.0' in text
    assert 'app_replica_up{model_name="m",replica="r3"} 0.0' in text and 'replica="r3"} 1.0' not in text
    assert 'app_replica_up{model_name="m",replica="r1"} 1.0' in text


def test_a_model_s_single_figure_adds_counts_averages_shares_and_is_healthy_only_when_every_replica_is():
    one = combined([_stats(2), _stats(4, healthy=False, wedged=1, kv=0.1)])
    assert (one.admission.running, one.admission.in_system, one.engine.running) == (6, 8, 6)
    assert one.engine.generation_tokens_total == 60 and one.kv_cache_tokens == 2000
    assert one.engine.kv_cache_usage == 0.3 and one.wedged_total == 1
    assert one.healthy is False and one.ready is True
    assert one.admission.predicted_first_token_s == 2.0  # the longest wait predicted
    assert combined([_stats(3)]) == _stats(3)  # one replica is its own figure
    assert combined([replace(_stats(1), ready=False), _stats(1)]).ready


async def test_stats_shows_the_model_s_figure_and_every_replica(client):
    body = (await client.get("/stats")).json()
    (model,) = body.values()
    assert set(model["replicas"]) == {"local"}
    assert model["healthy"] is True and model["replicas"]["local"]["healthy"] is True
    assert model["admission"] == model["replicas"]["local"]["admission"]
