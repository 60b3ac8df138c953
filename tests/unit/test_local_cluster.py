"""The local cluster's plan, without starting Ray: which cores each worker node is confined to, and the state file
that `cluster down` reads (a cluster started by one process is stopped by another)."""

from __future__ import annotations

from app.cli import local_cluster
from app.cli.local_cluster import ClusterState, Node, worker_cores


def test_each_worker_gets_its_own_core_while_there_are_enough():
    assert worker_cores(2, 1, [0, 1]) == [{0}, {1}]
    assert worker_cores(2, 2, [0, 1, 2, 3]) == [{0, 1}, {2, 3}]


def test_more_workers_than_cores_share_them_round_robin():
    assert worker_cores(3, 1, [0, 1]) == [{0}, {1}, {0}]
    assert worker_cores(2, 1, [5]) == [{5}, {5}]


def test_the_state_file_round_trips(tmp_path):
    state = ClusterState("127.0.0.1:6379", "http://127.0.0.1:8265", "app-cluster-6379",
                         (Node("head", 11, "/x/head.log"), Node("worker-1", 12, "/x/w1.log")), "/tmp/rc-x")
    path = tmp_path / "cluster.json"
    state.save(path)
    assert ClusterState.load(path) == state


def test_a_machine_that_never_ran_ray_gets_a_token_from_ray_s_own_tool(tmp_path, monkeypatch):
    """`ray start --head` with token auth makes no token of its own (it died on a fresh machine); up() has Ray's
    `get-auth-token --generate` write the default file first, and keeps a token that is already there."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN_PATH", raising=False)
    token = tmp_path / ".ray" / "auth_token"
    local_cluster._ensure_auth_token({})
    first = token.read_text().strip()
    assert len(first) >= 16
    local_cluster._ensure_auth_token({})
    assert token.read_text().strip() == first
