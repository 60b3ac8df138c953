"""`python -m app cluster up|down`: a head and worker nodes on this machine, each its own raylet, made with Ray's
own `ray start`; up prints the address, down leaves no process behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from app.local_cluster import TAG_ENV, ClusterState, _tagged, env_for_clients
from tests.integration.conftest import REPO

pytestmark = pytest.mark.integration


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "app", "cluster", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_cluster_up_makes_separate_nodes_and_down_leaves_nothing(tmp_path):
    env = {**os.environ, "APP_CLUSTER_DIR": str(tmp_path)}
    up = _cli("up", "--workers", "2", env=env)
    state_path = tmp_path / "cluster.json"
    try:
        assert up.returncode == 0, up.stderr
        state = ClusterState.load(state_path)
        assert up.stdout.strip() == state.address and state.address.startswith("127.0.0.1:")
        assert [n.name for n in state.nodes] == ["head", "worker-1", "worker-2"]
        probe = subprocess.run(
            [sys.executable, "-c", "import json, ray; ray.init(); print(json.dumps([{'alive': n['Alive'], "
             "'ip': n['NodeManagerAddress'], 'res': n['Resources']} for n in ray.nodes()]))"],
            env={**os.environ, **env_for_clients(state.address)}, capture_output=True, text=True, timeout=120)
        nodes = json.loads(probe.stdout.strip().splitlines()[-1])
        assert len(nodes) == 3 and all(n["alive"] and n["ip"] == "127.0.0.1" for n in nodes)
        workers = sorted(k for n in nodes for k in n["res"] if k.startswith("worker-"))
        assert workers == ["worker-1", "worker-2"]
        assert sorted(n["res"].get("CPU", 0) for n in nodes) == [0, 1, 1]  # the head computes nothing
        assert _tagged(state.tag), "the nodes' processes carry the cluster's tag"
    finally:
        down = _cli("down", env=env)
    assert down.returncode == 0, down.stderr
    assert not state_path.exists()
    assert not _tagged(state.tag), f"left behind: {[p.pid for p in _tagged(state.tag)]} ({TAG_ENV})"
