"""free_port: a loopback port for a process the CLI starts (the local cluster's GCS and dashboard)."""

from __future__ import annotations

import random
import socket

# Below the kernel's ephemeral range (32768-60999 on Linux), whence every process that binds port 0 draws, Ray's own
# among them between this pick and the node's bind; above Ray's worker ports (10002-19999).
PORTS = range(20000, 32768)


def free_port() -> int:
    while True:
        port = random.choice(PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
