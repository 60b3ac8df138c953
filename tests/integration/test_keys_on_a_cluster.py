"""`python -m app serve` with `RAY_ADDRESS` deploys onto an existing multi-node Ray cluster (the local cluster of
`python -m app cluster up`: a head and a worker node), and API keys given in the launching shell reach the replicas
there: they are resolved where the app is built, not read from each replica's (or node's) environment."""

from __future__ import annotations

import sys

import httpx
import pytest
import yaml

from loadkit.service import ProcessGroup, free_port
from tests.integration.conftest import MODEL, REPO, STARTUP_TIMEOUT_S, Service, base_config, stop_service
from tests.support.ray_cluster import running_local_cluster
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration
KEY = "key-from-the-launching-shell"


def test_keys_from_the_shell_reach_replicas_on_an_existing_cluster(tmp_path):
    with running_local_cluster(tmp_path, workers=1) as cluster:  # no key in any node's environment
        config = base_config(free_port())
        config["service"]["api_keys"] = []  # none in the file: only the shell has one
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(config))
        group = ProcessGroup([sys.executable, "-m", "app", "serve", "--config", str(path),
                              "--startup-timeout", str(STARTUP_TIMEOUT_S)],
                             cwd=REPO, env=cluster.env(APP_API_KEYS=KEY),
                             log_path=tmp_path / "service.log")
        svc = Service(f"http://127.0.0.1:{config['service']['port']}", group)
        try:
            assert svc.wait_healthy(STARTUP_TIMEOUT_S), group.log_tail(4000)
            base = svc.base_url
            assert httpx.get(f"{base}/v1/models", timeout=30).status_code == 401
            wrong = httpx.get(f"{base}/v1/models", headers={"Authorization": "Bearer nope"}, timeout=30)
            assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_api_key"
            ok = httpx.get(f"{base}/v1/models", headers={"Authorization": f"Bearer {KEY}"}, timeout=30)
            assert ok.status_code == 200 and ok.json()["data"][0]["id"] == MODEL
            assert httpx.get(f"{base}/health", timeout=30).status_code == 200  # probes stay open
            # The whole log (Serve's access lines can push the line out of any fixed tail), and waiting for it: the
            # replica answers through the proxy a moment before the CLI prints its ready line.
            wait_until(lambda: "authentication on, 1 key(s)" in group.log_path.read_text(errors="replace"),
                       timeout_s=60, what="the CLI's ready line saying authentication is on")
        finally:
            stop_service(svc)
