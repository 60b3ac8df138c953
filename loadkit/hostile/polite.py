"""The polite client: one normal short chat every second, in a process of its own, and what its records say.

It runs beside the attack in its own process (blocking httpx, nothing else to do), so its clock measures the
service and the kernel, not the driver's event loop full of hostile sockets. It stops when its stdin closes
(the driver closes the pipe, or dies) or at `--max-s`; it appends each record to its `--out` file as a JSON
line as soon as the request ends, so the driver can read them while it runs. Times are
`time.monotonic()`, which on Linux is one clock for every process of the machine.

    python -m loadkit.hostile.polite --base-url http://127.0.0.1:8000 --model NAME --out FILE [--api-key KEY]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict
from pathlib import Path

from loadkit.record import Record
from loadkit.service import pythonpath

PROMPT = "Say hello in one short sentence."
POLITE = "polite"  # its records' kind; outcomes: ok | refused (429/503) | error (another status) | timeout | transport


def served_again_s(records: list[Record], attack_start: float) -> float | None:
    """Seconds from the attack's start to the end of the first 200 among the requests sent after it began."""
    ends = [r.end for r in records if r.start >= attack_start and r.outcome == "ok"]
    return min(ends) - attack_start if ends else None


def between(records: list[Record], t0: float, t1: float) -> list[Record]:
    """The requests sent in [t0, t1)."""
    return [r for r in records if t0 <= r.start < t1]


def status_counts(records: list[Record]) -> dict[str, int]:
    return dict(Counter(r.label for r in records).most_common())


def longest_unserved_s(records: list[Record], t0: float, t1: float) -> float:
    """The longest stretch inside [t0, t1] with no polite request completed with 200."""
    ends = sorted(r.end for r in records if r.outcome == "ok" and t0 <= r.end <= t1)
    edges = [t0, *ends, t1]
    return max((b - a for a, b in zip(edges, edges[1:], strict=False)), default=t1 - t0)


def load(path: Path) -> list[Record]:
    """The records written so far (a line being written is skipped)."""
    out = []
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            out.append(Record.from_dict(json.loads(line)))
        except (ValueError, TypeError):
            continue
    return out


def _one(client, model: str) -> tuple[int | None, str, str]:
    import httpx

    body = {"model": model, "temperature": 0, "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]}
    try:
        r = client.post("/v1/chat/completions", json=body)
    except httpx.TimeoutException as err:
        return None, "timeout", type(err).__name__
    except httpx.TransportError as err:
        return None, "transport", f"{type(err).__name__}: {err}"[:120]
    if r.status_code == 200:
        return 200, "ok", ""
    return r.status_code, "refused" if r.status_code in (429, 503) else "error", r.text[:120]


def run(base_url: str, model: str, api_key: str | None, interval_s: float, timeout_s: float, max_s: float,
        stop: threading.Event, out: Path) -> int:
    """Chats until `stop` or `max_s`, appending each record to `out`; how many were sent."""
    import httpx

    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    deadline, sent = time.monotonic() + max_s, 0
    with (httpx.Client(base_url=base_url, headers=headers, timeout=httpx.Timeout(timeout_s, connect=10)) as client,
          out.open("a") as sink):
        while not stop.is_set() and time.monotonic() < deadline:
            t0 = time.monotonic()
            status, outcome, detail = _one(client, model)
            rec = Record(t0, time.monotonic(), outcome, status, detail=detail, kind=POLITE)
            sink.write(json.dumps(asdict(rec)) + "\n")
            sink.flush()
            sent += 1
            stop.wait(max(0.0, interval_s - (time.monotonic() - t0)))  # the 1 s pace IS the behaviour
    return sent


class PoliteProcess:
    """The driver's handle on the polite client's process: started beside the attack, stopped by closing its
    stdin (killed if it is still busy after a request's timeout)."""

    def __init__(self, base_url: str, model: str, api_key: str | None, interval_s: float, timeout_s: float,
                 out: Path):
        self.out, self.timeout_s = out, timeout_s
        env = {**os.environ, "PYTHONPATH": pythonpath()}  # the kit, also before `pip install -e .` knows it
        cmd = [sys.executable, "-m", "loadkit.hostile.polite", "--base-url", base_url, "--model", model,
               "--interval", str(interval_s), "--timeout", str(timeout_s), "--out", str(out),
               *(["--api-key", api_key] if api_key else [])]
        out.write_text("")
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, env=env)

    def records(self) -> list[Record]:
        return load(self.out)

    def stop(self) -> list[Record]:
        """Idempotent: the records, once the process has ended."""
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=self.timeout_s + 15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.records()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--api-key")
    parser.add_argument("--interval", type=float, default=1.0)
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--max-s", type=float, default=1800.0, help="stop after this long whatever happens")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())

    def watch_stdin() -> None:
        sys.stdin.read()  # returns at EOF: the driver closed the pipe (or is gone)
        stop.set()

    threading.Thread(target=watch_stdin, daemon=True).start()
    run(args.base_url, args.model, args.api_key, args.interval, args.timeout, args.max_s, stop, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
