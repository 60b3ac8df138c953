"""The chaos driver's parts that need no cluster: its Serve config (the manifest's, on loopback), the faults it
knows, and the table's verdict, which must fail a round that lost a request, broke a stream or never recovered."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from loadkit.chaos.faults import FAULTS
from loadkit.chaos.round import RoundResult, passed, row, section
from loadkit.chaos.run import serve_config

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

GOOD = RoundResult(fault="node-loss", what="worker node lost", requests=40, failures=(), long_streams=2,
                   long_streams_broken=(), migrations=3, retries=1, longest_stall_s=4.25, capacity_back_s=151.4)


def test_the_serve_config_is_the_manifests_on_loopback_with_the_short_grace_and_a_tool_call_parser():
    config = serve_config(CONFIGS / "kuberay" / "rayservice-cpu.yaml", 8123, 2)
    assert config["http_options"] == {"host": "127.0.0.1", "port": 8123}
    assert config["proxy_location"] == "HeadOnly"
    assert config["applications"][0]["args"]["config"]["service"]["drain_grace_s"] == 2
    assert config["applications"][0]["args"]["config"]["models"][0]["engine"]["tool_call_parser"] == "hermes"


def test_every_fault_of_the_issue_is_there_in_order():
    assert list(FAULTS) == ["engine-kill", "engine-stop", "replica-kill", "node-loss", "rolling-update"]


def test_a_round_passes_only_with_no_failure_no_broken_stream_and_capacity_back():
    assert passed(GOOD)
    assert not passed(replace(GOOD, failures=("APIConnectionError: Connection error.",)))
    assert not passed(replace(GOOD, long_streams_broken=("finish None, usage None",)))
    assert not passed(replace(GOOD, capacity_back_s=None))


def test_the_table_shows_each_figure_and_the_verdict():
    assert row(GOOD) == "| worker node lost | 40 | 0 | 2 of 2 | 3 | 1 | 4.2 | 151 | 0 of 0 |"
    twins = replace(GOOD, twins_same=("greedy", "stop string"), twins_differ=("seeded n 2",))
    assert row(twins).endswith("| 2 of 3 (seeded n 2 differ) |")
    assert section([GOOD], ["facts"]).endswith("Verdict: every fault cost the clients nothing.")
    broken = replace(GOOD, failures=("InternalServerError: 503",))
    text = section([GOOD, broken], [])
    assert "Verdict: FAIL: node-loss." in text and "InternalServerError: 503" in text
    assert "not within the bound" in row(replace(GOOD, capacity_back_s=None))
