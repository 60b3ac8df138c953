"""A Ray cluster the tests start with Ray's own tool, `ray start --head --block`, bound to loopback.

`--block` makes the `ray start` process own its node: stopping its process group (loadkit.service.ProcessGroup)
stops every process of that node. Deploying onto it is the `RAY_ADDRESS` path users take with an existing
cluster (and what KubeRay gives a RayService).
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadkit.service import ProcessGroup, child_env, free_port, wait_until

RAY = str(Path(sys.executable).with_name("ray"))
# For the head and for every process that connects to it: node addresses on loopback (Ray otherwise turns
# 127.0.0.1 into the machine's interface address), and Ray's token authentication on both sides.
LOOPBACK_CLUSTER_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_AUTH_MODE": "token"}


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@contextmanager
def ray_head(tmp: Path, num_cpus: int = 2) -> Iterator[str]:
    """A head node with `num_cpus` CPUs for the duration of the block; yields its address."""
    port = free_port()
    group = ProcessGroup([RAY, "start", "--head", "--block", f"--port={port}", "--node-ip-address=127.0.0.1",
                          f"--num-cpus={num_cpus}", "--include-dashboard=false", "--disable-usage-stats"],
                         cwd=tmp, env=child_env(**LOOPBACK_CLUSTER_ENV), log_path=tmp / "ray-head.log")
    try:
        if not wait_until(lambda: _listening(port), timeout_s=60, gave_up=lambda: not group.running()):
            raise RuntimeError(f"the Ray head did not start; log tail:\n{group.log_tail()}")
        yield f"127.0.0.1:{port}"
    finally:
        report = group.stop(sigint_wait_s=0, sigterm_wait_s=40)
        assert report.clean, report.text()
