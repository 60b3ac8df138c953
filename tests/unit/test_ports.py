"""Ports for the processes a run starts come from below the kernel's ephemeral range, where no process binding port 0
can take one between the pick and the bind (a run's replica once met "Address already in use" that way)."""

from __future__ import annotations

import random
import socket

import pytest

from app.cli import ports
from loadkit import service


@pytest.mark.parametrize("module", [ports, service])
def test_a_free_port_is_outside_the_ephemeral_range_and_free(module, monkeypatch):
    low, high = (int(v) for v in open("/proc/sys/net/ipv4/ip_local_port_range").read().split())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        assert low <= taken.getsockname()[1] <= high  # where port 0 draws from
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        busy = held.getsockname()[1]
        picks = iter([20000 + (busy % 1000), 20000 + (busy % 1000), 21000 + (busy % 1000)])
        with socket.socket() as blocker:
            blocker.bind(("127.0.0.1", 20000 + (busy % 1000)))  # the first pick is taken: another is drawn
            monkeypatch.setattr(random, "choice", lambda _: next(picks))
            port = module.free_port()
    assert port == 21000 + (busy % 1000) and port < low and port not in range(10002, 20000)
