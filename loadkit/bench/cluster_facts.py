"""The facts of one `app-cluster` launch beyond the load generator's figures: how long the cluster took to come
up, the time from `serve deploy` to every replica running, each engine replica's node and start-up time, and each
replica's share of every load run's requests and output tokens; and the settings changed from the manifest.

benchmarks/app_cluster.py writes the first part (nodes, pids, timings) to its facts file once every replica runs;
the rest is read from the engine replicas' own log lines (replica_logs) while the cluster still runs. Saved in
results.json with the launch, as a plain dict.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path

import yaml

from loadkit.bench.cluster_config import ENGINE_DEPLOYMENT, MANIFEST, changes, manifest_serve_config
from loadkit.bench.replica_logs import read_worker_lines, shares, startup_seconds


def wait_facts(path: Path, timeout_s: float, running: Callable[[], bool]) -> dict | None:
    """The facts file's contents once the system has written it (it does so just after every replica runs)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and running():
        if path.exists():
            try:
                return json.loads(path.read_text())
            except json.JSONDecodeError:  # caught while being written
                pass
        time.sleep(0.5)  # polling for a file the system writes once
    return None


def config_changes(repo: Path, serve_config: Path) -> list[str]:
    """What the deployed config changed from the manifest's serveConfigV2 ('key: old -> new')."""
    manifest = manifest_serve_config((repo / MANIFEST).read_text())
    return changes(manifest, yaml.safe_load(serve_config.read_text()))


def observed(facts: dict, trace_prefixes: dict[int, str]) -> dict:
    """`facts` with each engine replica's start-up time and each load run's shares (by concurrency) added, from
    the replicas' log lines as they are now."""
    logs = Path(facts["logs_dir"])
    engines = [dict(r) for r in facts.get("replicas", []) if r.get("deployment") == ENGINE_DEPLOYMENT]
    lines = {r["node"]: read_worker_lines(logs, int(r["pid"])) for r in engines}
    for r in engines:
        r["startup_s"] = startup_seconds(lines[r["node"]])
    return {**facts, "engines": engines,
            "shares": [{"concurrency": c, "shares": [s.to_dict() for s in shares(lines, prefix)]}
                       for c, prefix in trace_prefixes.items()]}
