"""A stream whose client stops reading, against a running service: does its engine request leave the engine, and does
the client, reading again, get the whole answer, the same as an undisturbed one? Prints what it sees as it goes and
one JSON line at the end.

The client is a raw socket with a 4 KiB receive buffer that reads the response's first bytes, then nothing for
`--idle-s`, then the rest. Meanwhile it polls `/metrics` for the engine's running requests and the pauses counted
(`app_requests_migrated_total{outcome="paused"}` behind a separate ingress; the colocated replica shows its paused
requests as `aside` in `/stats`). The same request is then sent without streaming and the texts compared.

    .venv/bin/python scripts/pause_probe.py [--base-url http://127.0.0.1:8000] [--n 2] [--idle-s 12]
"""

from __future__ import annotations

import argparse
import json
import socket
import time
from typing import Any
from urllib.parse import urlsplit

import httpx

WATCHED = ("app_requests_migrated_total", "vllm:num_requests_running")


def _watched(base_url: str) -> dict[str, float]:
    figures: dict[str, float] = {}
    for line in httpx.get(f"{base_url}/metrics", timeout=10).text.splitlines():
        if line.startswith(WATCHED) and 'outcome="resumed"' not in line:
            series, value = line.rsplit(" ", 1)
            name = series.split("{")[0]
            figures[name] = figures.get(name, 0.0) + float(value)
    return figures


def _stream_with_a_pause(base_url: str, body: dict[str, Any], idle_s: float) -> tuple[str, list[dict[str, float]]]:
    where = urlsplit(base_url)
    payload = json.dumps({**body, "stream": True}).encode()
    seen: list[dict[str, float]] = []
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # the server's writes stall soon
        s.connect((where.hostname or "127.0.0.1", where.port or 80))
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: probe\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % len(payload) + payload)
        data = s.recv(2048)
        started = time.monotonic()
        while time.monotonic() - started < idle_s:
            time.sleep(1.5)
            seen.append({"t_s": round(time.monotonic() - started, 1), **_watched(base_url)})
            print("not reading:", seen[-1], flush=True)
        s.settimeout(300)
        while b"data: [DONE]" not in data[-64:]:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return data.decode(errors="replace"), seen


def _texts(stream: str, n: int) -> tuple[list[str], list[str | None], list[str]]:
    texts: list[str] = [""] * n
    finish: list[str | None] = [None] * n
    errors: list[str] = []
    for line in stream.splitlines():
        if not line.startswith("data: {"):
            continue
        event = json.loads(line[len("data: "):])
        if "error" in event:
            errors.append(event["error"]["message"])
        for choice in event.get("choices", ()):
            texts[choice["index"]] += choice["delta"].get("content") or ""
            finish[choice["index"]] = choice.get("finish_reason") or finish[choice["index"]]
    return texts, finish, errors


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--n", type=int, default=2, help="choices (seeded sampling when above 1, else greedy)")
    parser.add_argument("--max-tokens", type=int, default=600)
    parser.add_argument("--idle-s", type=float, default=12.0, help="how long the client reads nothing")
    args = parser.parse_args()
    body = {"model": args.model, "messages": [{"role": "user", "content": "Write a long story about a dragon."}],
            "max_tokens": args.max_tokens, "n": args.n, "ignore_eos": True, "logprobs": True, "top_logprobs": 5,
            **({"temperature": 0.8, "seed": 11} if args.n > 1 else {"temperature": 0})}
    before = _watched(args.base_url)
    stream, seen = _stream_with_a_pause(args.base_url, body, args.idle_s)
    texts, finish, errors = _texts(stream, args.n)
    undisturbed = httpx.post(f"{args.base_url}/v1/chat/completions", json=body, timeout=300).json()
    same = [c["message"]["content"] == texts[c["index"]] for c in undisturbed["choices"]]
    paused = seen[-1].get("app_requests_migrated_total", 0.0) - before.get("app_requests_migrated_total", 0.0)
    print(json.dumps({"pauses_counted": paused, "engine_running_while_unread": [f.get("vllm:num_requests_running")
                                                                               for f in seen],
                      "finish_reasons": finish, "error_events": errors, "same_as_undisturbed": same}))


if __name__ == "__main__":
    main()
