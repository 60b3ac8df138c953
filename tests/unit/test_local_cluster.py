"""The local cluster's plan, without starting Ray: which cores each worker node is confined to, and the state file
that `cluster down` reads (a cluster started by one process is stopped by another)."""

from __future__ import annotations

import subprocess
import sys

from app.cli import local_cluster
from app.cli.local_cluster import ClusterState, Node, worker_cores
from loadkit.waiting import wait_until

# A node's session that, on SIGTERM, drains until the other one has been told to stop too, then exits cleanly.
DRAINING_NODE = """
import pathlib, signal, sys, time
me, other = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
def term(*_):
    me.with_suffix(".term").touch()
    while not other.with_suffix(".term").exists():
        time.sleep(0.01)
    me.with_suffix(".clean").touch()
    sys.exit(0)
signal.signal(signal.SIGTERM, term)
me.with_suffix(".ready").touch()
while True:
    time.sleep(1)
"""


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


def test_worker_nodes_are_stopped_side_by_side(tmp_path):
    """`cluster down` tells every worker node to stop at once: two nodes that each drain until the other has been told
    too both end by themselves (told one after the other, the first would wait out its grace and be killed)."""
    a, b = tmp_path / "a", tmp_path / "b"
    procs = [subprocess.Popen([sys.executable, "-c", DRAINING_NODE, str(me), str(other)], start_new_session=True)
             for me, other in ((a, b), (b, a))]
    try:
        wait_until(lambda: a.with_suffix(".ready").exists() and b.with_suffix(".ready").exists(), timeout_s=60,
                   what="both nodes up")
        local_cluster.stop_nodes([Node("worker-1", procs[0].pid, ""), Node("worker-2", procs[1].pid, "")],
                                 grace_s=30)
        assert a.with_suffix(".clean").exists() and b.with_suffix(".clean").exists()
    finally:
        for p in procs:
            p.kill()
            p.wait()
