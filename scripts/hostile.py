#!/usr/bin/env python
"""Hostile clients: slow readers, idle and half-open connections, giant prompts and keys that never arrive
must not take the service from everyone else.

Bounded in count and time, loopback only. By default it starts its own service
(`python -m app serve`) from a config generated from configs/cpu.yaml (a free port, a
generated API key, connection clocks lowered to keep the run short: header 5 s, body 10 s,
keep-alive 10 s, write stall 10 s) and stops it at the end, leaving no process behind. With
--url it drives a running service (tell it that service's clocks with the --*-timeout flags).

While a polite client in its own process sends one short chat a second, one client process
opens, at once: --non-readers streams it never reads, --idle connections that send nothing,
--slowloris connections sending one header byte every --slowloris-interval seconds, --huge-headers
header blocks of --huge-header-mb MiB, --giant-prompts prompts of --giant-prompt-kb KB and a
/tokenize flood; after --duration seconds it closes them all, waits for the service to be idle
and asks it the capital of France.

Prints PASS/FAIL per target, writes the whole result as JSON into --work-dir and the report
into docs/hostile.md between generated-section markers (--output - : print only). Exit status 0
only if every target passes. The work is done by `loadkit.hostile`; this file is its command line.

    .venv/bin/python scripts/hostile.py                        # the issue's scenario, ~5 min
    .venv/bin/python scripts/hostile.py --non-readers 5 --idle 20 --slowloris 5 --duration 30 --output -
    .venv/bin/python scripts/hostile.py --url http://127.0.0.1:8000 --api-key KEY --write-stall-timeout 30
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kit, also before `pip install -e .` knows it

from loadkit.hostile.deployment import NotLoopback, loopback_url  # noqa: E402
from loadkit.hostile.plan import Plan  # noqa: E402
from loadkit.hostile.run import Options, run  # noqa: E402

_PLAN_FLAGS = {  # flag -> (Plan field, type, scale from the flag's unit to the field's)
    "duration": ("duration_s", float, 1), "baseline": ("baseline_s", float, 1),
    "settle_timeout": ("settle_timeout_s", float, 1), "non_readers": ("non_readers", int, 1),
    "non_reader_max_tokens": ("non_reader_max_tokens", int, 1), "non_reader_rcvbuf": ("non_reader_rcvbuf", int, 1),
    "non_reader_n": ("non_reader_n", int, 1), "non_reader_logprobs": ("non_reader_logprobs", int, 1),
    "idle": ("idle", int, 1), "slowloris": ("slowloris", int, 1),
    "slowloris_interval": ("slowloris_interval_s", float, 1), "huge_headers": ("huge_headers", int, 1),
    "huge_header_mb": ("huge_header_bytes", float, 2**20), "giant_prompts": ("giant_prompts", int, 1),
    "giant_prompt_kb": ("giant_prompt_bytes", float, 1000), "tokenize_clients": ("tokenize_clients", int, 1),
    "tokenize_requests": ("tokenize_requests", int, 1), "polite_timeout": ("polite_timeout_s", float, 1),
    "serve_grace": ("serve_grace_s", float, 1),
}
_CLOCK_FLAGS = ("header_timeout", "body_timeout", "keep_alive_timeout", "write_stall_timeout")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Plan()
    for flag, (name, kind, scale) in _PLAN_FLAGS.items():
        default = getattr(defaults, name) / scale
        parser.add_argument("--" + flag.replace("_", "-"), type=kind, default=None,
                            help=f"default {default:g}")
    for flag in _CLOCK_FLAGS:
        parser.add_argument("--" + flag.replace("_", "-"), type=float, default=None,
                            help=f"service.{flag}_s: set in the generated config (own service), or what the "
                                 "--url service has (default there: the documented default)")
    parser.add_argument("--url", help="drive this running service instead of starting one (loopback only)")
    parser.add_argument("--api-key", default=os.environ.get("HOSTILE_API_KEY"), help="bearer key for --url")
    parser.add_argument("--model", help="model id (default: the config's first model, or the first of /v1/models)")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "cpu.yaml",
                        help="base config of the service it starts")
    parser.add_argument("--output", type=Path, default=REPO / "docs" / "hostile.md",
                        help="report file, its generated section replaced ('-': print only)")
    parser.add_argument("--work-dir", type=Path, default=REPO / "bench-results" / "hostile",
                        help="where the JSON result (and an own service's config and log) go")
    parser.add_argument("--startup-timeout", type=float, default=600.0)
    args = parser.parse_args(argv)
    if args.url:
        try:
            loopback_url(args.url)
        except NotLoopback as err:
            parser.error(str(err))
    return args


def plan_of(args: argparse.Namespace) -> Plan:
    values = {}
    for flag, (name, _, scale) in _PLAN_FLAGS.items():
        given = getattr(args, flag)
        if given is not None:
            values[name] = int(given * scale) if scale != 1 else given
    return Plan(**values)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if argv is None:
        exe = os.path.relpath(sys.executable, Path.cwd()) if sys.executable.startswith(str(REPO)) else sys.executable
        command = shlex.join([exe, *sys.argv])
    else:
        command = shlex.join(["scripts/hostile.py", *argv])
    clocks = {f"{flag}_s": v for flag in _CLOCK_FLAGS if (v := getattr(args, flag)) is not None}
    return run(Options(repo=REPO, command=command, plan=plan_of(args), url=args.url, api_key=args.api_key,
                       model=args.model, config=args.config, clocks=clocks, output=args.output,
                       work_dir=args.work_dir, startup_timeout=args.startup_timeout))


if __name__ == "__main__":
    sys.exit(main())
