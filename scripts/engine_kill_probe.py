"""A running service's engine killed under a greedy stream and a plain request: do both end whole, and as an
undisturbed answer? Against a service on this machine with one engine (the default `make serve`, or the ingress tier
with one engine replica: `service.colocate_ingress: false`), it takes an undisturbed answer, starts a 128-token
greedy stream and then a plain request of the same, SIGKILLs the `VLLM::EngineCore` (or SIGSTOPs it: `--stop`, a
wedge the replica finds), and prints when both ended, whether each is whole and equal to the undisturbed answer, and
the service's `app_requests_migrated_total`.

    .venv/bin/python scripts/engine_kill_probe.py [--base-url http://127.0.0.1:8000] [--api-key KEY] [--stop]
        [--replica]

`--replica` SIGKILLs the engine replica's whole process instead (behind the ingress tier Serve starts another and the
requests continue there; a replica that serves HTTP itself takes its clients' connections with it).

It kills only the EngineCore of the `python -m app serve` whose processes listen on the URL's port.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadkit.long_stream import LongStream  # noqa: E402

STORY = {"messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 128, "temperature": 0}


def engine_core(port: int) -> psutil.Process:
    """The EngineCore of the `python -m app serve` whose process tree listens on `port`."""
    listeners = {c.pid for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port and c.pid}
    for p in psutil.process_iter(["cmdline"]):
        if "app serve" not in " ".join(p.info["cmdline"] or []):
            continue
        tree = [p, *p.children(recursive=True)]
        if listeners & {q.pid for q in tree}:
            cores = [q for q in tree if "EngineCore" in " ".join(q.cmdline())]
            if cores:
                return cores[0]
    raise SystemExit(f"no EngineCore found under the `python -m app serve` listening on port {port}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--base-url", default="http://127.0.0.1:8000")
    ap.add_argument("--api-key", default="none")
    ap.add_argument("--stop", action="store_true", help="SIGSTOP the EngineCore (a wedge) instead of SIGKILL")
    ap.add_argument("--replica", action="store_true",
                    help="SIGKILL the engine replica's whole process (the EngineCore's parent) instead")
    args = ap.parse_args()
    url, headers = args.base_url, {"Authorization": f"Bearer {args.api_key}"}
    model = httpx.get(f"{url}/v1/models", headers=headers).json()["data"][0]["id"]
    body = {"model": model, **STORY, "ignore_eos": True}
    reference = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300).json()
    undisturbed = reference["choices"][0]["message"]["content"]
    core = engine_core(urlparse(url).port or 80)
    target = core.parent() if args.replica else core
    plain: dict[str, httpx.Response | Exception] = {}
    stream = LongStream(url, args.api_key, model, **STORY, extra_body={"ignore_eos": True})
    stream.start()
    while stream.chunks < 3 and stream.is_alive():
        time.sleep(0.05)
    def send_plain() -> None:
        try:
            plain["r"] = httpx.post(f"{url}/v1/chat/completions", json=body, headers=headers, timeout=300)
        except httpx.HTTPError as err:  # the replica that held the connection died (it serves HTTP itself)
            plain["r"] = err

    waiter = threading.Thread(target=send_plain)
    waiter.start()
    time.sleep(1.0)  # the plain request reaches the engine
    killed = time.monotonic()
    if args.stop:
        core.suspend()  # the replica's progress watch declares it wedged and SIGKILLs it with its restart
    else:
        target.kill()
    stream.join(300)
    waiter.join(300)
    done = "SIGSTOPped" if args.stop else "SIGKILLed"
    print(f"{'engine replica' if args.replica else 'EngineCore'} {target.pid} {done}; both ended "
          f"{time.monotonic() - killed:.1f} s after")
    print(f"stream: whole: {stream.whole() is None} ({stream.whole()}); equal to the undisturbed answer: "
          f"{stream.text == undisturbed}")
    r = plain["r"]
    if isinstance(r, Exception):
        print(f"plain request: {type(r).__name__}: {r}")
    else:
        same = r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == undisturbed
        print(f"plain request: {r.status_code}; equal to the undisturbed answer: {same}")
    try:
        metrics = httpx.get(f"{url}/metrics", headers=headers).text
    except httpx.HTTPError as err:  # a replica that served HTTP itself was killed: its successor may not listen yet
        print(f"/metrics: {type(err).__name__}: {err}")
        return
    print("\n".join(ln for ln in metrics.splitlines() if ln.startswith("app_requests_migrated_total{")))


if __name__ == "__main__":
    main()
