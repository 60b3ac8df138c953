"""The service's side of the attack: which process listens on the port (the replica itself, or Serve's proxy),
which is the Serve replica (by its `ServeReplica:*` title in the service's tree; else the listener), their memory,
descriptors and connections by client port (a hostile socket gone from that table was closed by the server,
whatever its client saw), the kernel's send queues; the replica's event-loop lag from its Prometheus histogram
(bounds, not exact percentiles: a bucket's upper edge); the engine's precision and its log's request outcomes.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import psutil

from loadkit.proctree import ProcessTree
from loadkit.server_stats import stats_json

REPLICA_TITLE = "ServeReplica:"
LAG_METRIC = "app_event_loop_lag_seconds"
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][\w:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)')
_LE = re.compile(r'le="([^"]+)"')


@dataclass(frozen=True)
class Sample:
    t: float  # monotonic
    rss: int  # the replica's resident memory, bytes
    fds: int  # the replica's open file descriptors
    connections: int  # the listener's TCP connections on the service's port (accepted, not the listening one)


@dataclass
class ServerView:
    port: int
    tree: ProcessTree | None  # the service's process tree (None: not known, only the listener)
    listener: psutil.Process | None = None
    replica: psutil.Process | None = None
    replica_title: str = ""
    samples: list[Sample] = field(default_factory=list)

    def locate(self) -> bool:
        """Finds the listener and the replica; True when the listener was found."""
        procs = self.tree.processes() if self.tree is not None else []
        self.listener = _listener(self.port, procs)
        replicas = [p for p in procs if REPLICA_TITLE in _title(p)]
        preferred = [p for p in replicas if self.listener is not None and p.pid == self.listener.pid]
        self.replica = (preferred or replicas or [self.listener])[0]
        self.replica_title = _title(self.replica)[:80] if self.replica is not None else ""
        return self.listener is not None

    def describe(self) -> str:
        if self.listener is None:
            return f"no process found listening on port {self.port} (no server-side view)"
        same = self.replica is not None and self.replica.pid == self.listener.pid
        replica = (f"the replica `{self.replica_title}` (pid {self.replica.pid})" if self.replica is not None
                   else "no replica")
        return (f"{replica} listens on port {self.port} itself" if same else
                f"pid {self.listener.pid} (`{_title(self.listener)[:60]}`) listens on port {self.port}; {replica}")

    def remote_ports(self) -> set[int] | None:
        """The client ports of every connection the listener holds on the service's port; None when unknown."""
        if self.listener is None:
            return None
        try:
            conns = self.listener.net_connections(kind="tcp")
        except psutil.Error:
            return None
        return {c.raddr.port for c in conns if c.raddr and c.laddr and c.laddr.port == self.port}

    def other_engines(self) -> int:
        """vLLM engine processes on this machine that are not the service's (another stack competing for the
        cores makes every figure of the run worse)."""
        mine = {p.pid for p in self.tree.processes()} if self.tree is not None else set()
        count = 0
        for p in psutil.process_iter(["pid", "name", "cmdline"]):
            # the kernel's name is cut at 15 characters ('VLLM::EngineCor'); the title in cmdline is whole
            text = (p.info["name"] or "") + " " + " ".join(p.info["cmdline"] or ())
            if p.info["pid"] not in mine and "VLLM::EngineCor" in text:
                count += 1
        return count

    def sample(self, ports: set[int] | None = None) -> Sample | None:
        if self.replica is None:
            return None
        try:
            rss, fds = self.replica.memory_info().rss, self.replica.num_fds()
        except psutil.Error:
            return None
        ports = self.remote_ports() if ports is None else ports
        s = Sample(time.monotonic(), rss, fds, len(ports or ()))
        self.samples.append(s)
        return s


def parse_send_queues(text: str, port: int) -> dict[int, int]:
    """From /proc/net/tcp(6) text: bytes in the kernel send queue (tx_queue: sent but unacknowledged, plus not
    yet sent) of every connection whose local port is `port`, by its remote (client) port."""
    out: dict[int, int] = {}
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 5 or ":" not in fields[1] or ":" not in fields[4]:
            continue
        local, remote, queues = fields[1], fields[2], fields[4]
        try:
            if int(local.rsplit(":", 1)[1], 16) == port:
                out[int(remote.rsplit(":", 1)[1], 16)] = int(queues.split(":")[0], 16)
        except ValueError:
            continue
    return out


def send_queues(port: int) -> dict[int, int]:
    """The server side's kernel send queues on `port` (this network namespace), by client port."""
    out: dict[int, int] = {}
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(name) as f:
                out.update(parse_send_queues(f.read(), port))
        except OSError:
            continue
    return out


def _title(p: psutil.Process | None) -> str:
    if p is None:
        return ""
    try:
        return p.name() + " " + " ".join(p.cmdline())
    except psutil.Error:
        return ""


def _listens(p: psutil.Process, port: int) -> bool:
    try:
        return any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port
                   for c in p.net_connections(kind="tcp"))
    except psutil.Error:
        return False


def _listener(port: int, procs: list[psutil.Process]) -> psutil.Process | None:
    """The process listening on `port`: among `procs` first, else anywhere this user may look."""
    for p in procs:
        if _listens(p, port):
            return p
    try:
        pids = [c.pid for c in psutil.net_connections(kind="tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid]
    except psutil.Error:
        return None
    for pid in pids:
        try:
            return psutil.Process(pid)
        except psutil.Error:
            continue
    return None


# -- the event-loop lag --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts, ascending by upper edge (the last edge is +Inf), with count and sum."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float  # the sum of observed values, seconds

    def minus(self, earlier: Histogram) -> Histogram:
        """The observations between `earlier` and this scrape (same buckets)."""
        before = dict(earlier.buckets)
        return Histogram(tuple((le, c - before.get(le, 0.0)) for le, c in self.buckets),
                         self.count - earlier.count, self.total - earlier.total)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count > 0 else None


def parse_histogram(text: str, name: str = LAG_METRIC) -> Histogram | None:
    """The histogram `name` (unlabelled but for `le`) from Prometheus text; None when absent."""
    buckets: dict[float, float] = {}
    count = total = None
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m:
            continue
        metric, value = m["name"], float(m["value"])
        if metric == f"{name}_bucket":
            le = _LE.search(m["labels"] or "")
            if le:
                buckets[math.inf if le[1] in ("+Inf", "Inf") else float(le[1])] = value
        elif metric == f"{name}_count":
            count = value
        elif metric == f"{name}_sum":
            total = value
    if not buckets or count is None:
        return None
    return Histogram(tuple(sorted(buckets.items())), count, total or 0.0)


def quantile_bound(h: Histogram, q: float) -> float | None:
    """The upper edge of the bucket holding the q-quantile (0..1): the q-quantile is at most this (math.inf:
    past the last finite edge); None for an empty window."""
    if h.count <= 0:
        return None
    need = q * h.count
    for le, cumulative in h.buckets:
        if cumulative >= need - 1e-9:
            return le
    return math.inf


def max_range(h: Histogram) -> tuple[float, float] | None:
    """(lower, upper) edges of the highest bucket that gained an observation: the maximum lies in it."""
    if h.count <= 0:
        return None
    lower = 0.0
    for le, cumulative in h.buckets:
        if cumulative >= h.count - 1e-9:
            return lower, le
        lower = le
    return lower, math.inf


def seconds_text(value: float | None) -> str:
    if value is None:
        return "-"
    return "unbounded" if math.isinf(value) else f"{value * 1000:g} ms"


# -- the engine ------------------------------------------------------------------------------------------------

@dataclass
class EngineFacts:
    dtype: str = "?"
    dtype_reason: str = ""
    compute_cores: list[int] = field(default_factory=list)


async def engine_facts(http: httpx.AsyncClient, model: str) -> EngineFacts:
    engine = (await stats_json(http, model)).get("engine") or {}
    return EngineFacts(engine.get("dtype") or "?", engine.get("dtype_reason") or "",
                       list(engine.get("compute_cores") or []))


async def lag_histogram(http: httpx.AsyncClient) -> Histogram | None:
    try:
        r = await http.get("/metrics", timeout=30)
    except httpx.HTTPError:
        return None
    return parse_histogram(r.text) if r.status_code == 200 else None


def engine_outcomes(log_text: str) -> tuple[dict[str, int], dict[str, float]]:
    """From a service log: how many `engine request` lines ended each way, and the median generated tokens of
    each outcome."""
    outcomes: Counter[str] = Counter()
    tokens: dict[str, list[int]] = {}
    for line in log_text.splitlines():
        if '"engine request"' not in line or "{" not in line:
            continue
        try:
            d = json.loads(line[line.index("{"):])
        except ValueError:
            continue
        outcome = str(d.get("outcome", "?"))
        outcomes[outcome] += 1
        tokens.setdefault(outcome, []).append(int(d.get("generated_tokens") or 0))
    medians = {k: sorted(v)[len(v) // 2] for k, v in tokens.items() if v}
    return dict(outcomes.most_common()), medians
