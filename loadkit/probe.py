"""`python -m loadkit probe`: the refusal probe, how fast an overloaded service answers a newcomer, measured
from a process of its own.

Every `interval_s` it opens a fresh connection and sends one small chat completion (`max_tokens` 1), then one
`GET /livez`, with blocking `http.client` and nothing else to do, so its clock measures the service and the
kernel, not a busy client (the overload driver's own event loop, dozens of streams parsed in Python on a
saturated machine, lags and adds that to every latency it measures). The overload driver runs it beside its
load. Prints (or writes with --out) JSON: per-outcome latency lists in seconds.

    python -m loadkit probe --base-url http://127.0.0.1:8000 --model NAME --duration 30 [--api-key KEY]
"""

from __future__ import annotations

import argparse
import http.client
import json
import time
from dataclasses import dataclass, field
from urllib.parse import urlsplit

OUTCOMES = ("refused", "served", "livez", "other")


def timed(host: str, port: int, method: str, path: str, body: bytes | None, headers: dict[str, str],
          timeout_s: float) -> tuple[int, float]:
    """(status, seconds) of one request on a new connection; status 0 when the connection failed."""
    started = time.perf_counter()
    conn = http.client.HTTPConnection(host, port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        return resp.status, time.perf_counter() - started
    except OSError:
        return 0, time.perf_counter() - started
    finally:
        conn.close()


def probe(base_url: str, model: str, api_key: str | None, duration_s: float, interval_s: float,
          timeout_s: float) -> dict[str, list[float]]:
    """Latencies in seconds by outcome (refused: 429/503, served: 200, livez: /livez 200, other), for
    `duration_s`. A plain dict of lists: it is what the probe's process writes as JSON."""
    url = urlsplit(base_url)
    host, port = url.hostname or "127.0.0.1", url.port or 80
    headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {api_key}"} if api_key else {})}
    body = json.dumps({"model": model, "max_tokens": 1, "temperature": 0,
                       "messages": [{"role": "user", "content": "Hi"}]}).encode()
    out: dict[str, list[float]] = {k: [] for k in OUTCOMES}
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        status, took = timed(host, port, "POST", "/v1/chat/completions", body, headers, timeout_s)
        out["refused" if status in (429, 503) else "served" if status == 200 else "other"].append(took)
        status, took = timed(host, port, "GET", "/livez", None, headers, timeout_s)
        out["livez" if status == 200 else "other"].append(took)
        time.sleep(interval_s)
    return out


@dataclass
class ProbeFindings:
    """What the probe saw, as the overload driver reads it back (seconds)."""

    refused: list[float] = field(default_factory=list)
    served: list[float] = field(default_factory=list)
    livez: list[float] = field(default_factory=list)
    other: list[float] = field(default_factory=list)

    @classmethod
    def from_json(cls, text: str) -> ProbeFindings:
        data = json.loads(text or "{}")
        return cls(**{k: list(data.get(k, [])) for k in OUTCOMES})


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m loadkit probe", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", required=True)
    p.add_argument("--model", required=True)
    p.add_argument("--api-key", default=None)
    p.add_argument("--duration", type=float, default=30.0, help="seconds to probe")
    p.add_argument("--interval", type=float, default=0.05, help="pause between probes, seconds")
    p.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    p.add_argument("--out", default=None, help="write the JSON here instead of stdout")
    args = p.parse_args(argv)
    text = json.dumps(probe(args.base_url, args.model, args.api_key, args.duration, args.interval, args.timeout))
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        print(text)
    return 0
