#!/usr/bin/env python
"""Overload check: overload must become queueing and fast, honest refusals.

Bounded in time and request count, loopback only. By default it starts its own
service (`python -m app serve`) from a config derived from configs/cpu.yaml with a
free port and a small, explicit capacity, and stops it at the end (Ctrl-C to its
process group), leaving no process behind. With --base-url it drives a running
service instead.

Phases (httpx async clients):
  a. idle      resident memory of the service's process tree at idle (after one warm-up request);
  b. capacity  exactly max_ongoing_requests clients in a closed loop for --duration seconds;
  c. overload  --overload-factor times as many clients, same request mix, same duration; refused
               clients back off min(Retry-After, 1 s) and retry;
  d. after     wait until /stats shows nothing running or queued, then one normal request.

Admission by time: the service refuses at arrival (429 over_time_target) a request whose predicted first
token is later than deployment.ttft_target_s (--ttft-target; the config's 10 s by default; 0 or none: off).
The report shows refusals by reason, admitted streams' first tokens against the target and the replica's
measured pace; with a target on, no request may wait out the queue timeout.

The request mix (prompt and output lengths, streaming or not, early hang-ups) comes from one
seeded generator, restarted with the same seed in phases b and c, so both phases draw the same
sequence of requests and their throughputs can be compared.

Prints PASS/FAIL per target and writes the results (command, machine, CPU flags, precision, date)
into docs/overload.md between generated-section markers (a --quick run only prints, unless
--output is given). Exit status 0 only if every target passes. The work is done by
`loadkit.overload`; this file is its command line.

    .venv/bin/python scripts/overload.py            # full run, ~45 s per phase
    .venv/bin/python scripts/overload.py --quick    # smoke run, short phases, prints only
    .venv/bin/python scripts/overload.py --ttft-target 5     # a tighter first-token target (none: off)
    .venv/bin/python scripts/overload.py --base-url http://127.0.0.1:8000 --api-key KEY --max-ongoing 32
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kit, also before `pip install -e .` knows it

from loadkit.overload.capacity import Capacity  # noqa: E402
from loadkit.overload.run import Options, run  # noqa: E402
from loadkit.overload.timing import parse_target_s  # noqa: E402

DEFAULT = object()  # --ttft-target not given: leave the config's ttft_target_s as it is


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=None,
                        help="seconds per loaded phase (default 45; 12 with --quick)")
    parser.add_argument("--overload-factor", type=float, default=6.0,
                        help="overload clients as a multiple of max_ongoing_requests (default 6)")
    parser.add_argument("--quick", action="store_true", help="smoke run: short phases; figures not meaningful")
    parser.add_argument("--base-url", help="drive this running service instead of starting one (loopback only)")
    parser.add_argument("--api-key", default=os.environ.get("OVERLOAD_API_KEY"), help="bearer key for --base-url")
    parser.add_argument("--model", help="model id (default: the config's first model, or the first of /v1/models)")
    parser.add_argument("--service-pid", type=int,
                        help="with --base-url: the `app serve` pid, for RSS (default: found via the port)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "cpu.yaml",
                        help="base config of the service it starts")
    parser.add_argument("--max-ongoing", type=int, default=8,
                        help="max_ongoing_requests (set in the generated config; tell it for --base-url)")
    parser.add_argument("--max-queued", type=int, default=8, help="max_queued_requests")
    parser.add_argument("--queue-timeout", type=float, default=10.0, help="queue_timeout_s")
    parser.add_argument("--request-timeout", type=float, default=60.0, help="service.request_timeout_s")
    parser.add_argument("--ttft-target", type=parse_target_s, default=DEFAULT, metavar="SECONDS",
                        help="deployment.ttft_target_s, the first-token target of admission by time ('0' or 'none': "
                             "off; default: the config's own, 10 s unless it says otherwise; tell it for "
                             "--base-url)")
    parser.add_argument("--output", type=Path, default=None,
                        help="report file, results replaced between markers ('-': do not write; default "
                             "docs/overload.md, '-' with --quick)")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.base_url:
        import httpx

        if httpx.URL(args.base_url).host not in ("127.0.0.1", "localhost", "::1"):
            parser.error("--base-url must be a loopback address")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if argv is None:
        exe = os.path.relpath(sys.executable, Path.cwd()) if sys.executable.startswith(str(REPO)) else sys.executable
        command = shlex.join([exe, *sys.argv])
    else:
        command = shlex.join(["scripts/overload.py", *argv])
    cap = Capacity(args.max_ongoing, args.max_queued, args.queue_timeout, args.request_timeout)
    if args.ttft_target is not DEFAULT:
        cap.ttft_target_s, cap.ttft_target_given = args.ttft_target, True
    output = args.output or (Path("-") if args.quick else REPO / "docs" / "overload.md")
    return run(Options(
        repo=REPO, command=command, duration=args.duration or (12.0 if args.quick else 45.0),
        idle_s=3.0 if args.quick else 5.0, overload_factor=args.overload_factor, quick=args.quick,
        base_url=args.base_url, api_key=args.api_key, model=args.model, service_pid=args.service_pid,
        config=args.config, output=output, startup_timeout=args.startup_timeout,
        capacity=cap))


if __name__ == "__main__":
    sys.exit(main())
