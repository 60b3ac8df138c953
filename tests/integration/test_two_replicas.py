"""Two engine replicas behind Serve's proxy: when one engine is killed under steady load, its replica leaves
the routing set (serving_router.py) and the other serves every request after the first few seconds; the
replacement is not routed to until its engine has loaded. A stack of its own (two engines on the machine)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.integration.conftest import MODEL, base_config, free_port, running_stack
from tests.support.engine_procs import engine_cores
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration

# The first few seconds after the kill may still fail: requests already on the dead replica, and those routed
# before the routing stats (polled every 1 s) carry the news. After that: none.
SETTLE_S = 5.0
AFTER_S = 20.0  # steady load measured for this long once settled
QUESTION = {"model": MODEL, "temperature": 0, "max_tokens": 8,
            "messages": [{"role": "user", "content": "What is the capital of France?"}]}


def test_a_killed_engine_costs_no_request_once_its_replica_has_left_the_routing_set(tmp_path):
    config = base_config(free_port())
    config["models"][0]["deployment"]["num_replicas"] = 2
    with running_stack(tmp_path, config) as svc:
        outcomes: list[tuple[float, int | str]] = []
        stop = threading.Event()

        def client() -> None:
            with httpx.Client(base_url=svc.base_url, headers=svc.headers, timeout=60) as c:
                while not stop.is_set():
                    sent = time.monotonic()
                    try:
                        status: int | str = c.post("/v1/chat/completions", json=QUESTION).status_code
                    except httpx.HTTPError as err:
                        status = type(err).__name__
                    outcomes.append((sent, status))

        cores = engine_cores(svc)
        assert len(cores) == 2, cores
        clients = [threading.Thread(target=client) for _ in range(3)]
        for t in clients:
            t.start()
        try:
            wait_until(lambda: sum(s == 200 for _, s in outcomes) >= 10, timeout_s=120, what="steady load served")
            killed_at = time.monotonic()
            cores[0].kill()
            settled = killed_at + SETTLE_S
            wait_until(lambda: sum(t >= settled + AFTER_S for t, _ in outcomes) > 0, timeout_s=300,
                       what="the load measured past the settling time")
        finally:
            stop.set()
            for t in clients:
                t.join(timeout=120)
    after = [s for t, s in outcomes if t >= settled]
    during = [s for t, s in outcomes if killed_at <= t < settled]
    print(f"{len(during)} requests in the {SETTLE_S:g} s after the kill: {sorted(map(str, during))[:12]}; "
          f"{len(after)} after: {sorted(set(map(str, after)))}")
    assert len(after) >= 5, after
    assert all(s == 200 for s in after), [s for s in after if s != 200]
