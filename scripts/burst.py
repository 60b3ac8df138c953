#!/usr/bin/env python3
"""The burst that opened issue 15, rerun the same way: N chat requests at once against a running service.

    make serve                                   # in one terminal (the default config)
    .venv/bin/python scripts/burst.py            # in another: 240 requests at once to http://127.0.0.1:8000

Each request is sent once (the `openai` SDK, max_retries=0), so every one's own fate shows: the first token of
the admitted ones against the first-token target, how fast the rest were refused and with what Retry-After, and
whether any waited out the queue timeout only to be refused. The mix is the goodput benchmark's (prompts about
40-430 tokens, outputs 16-256, half streaming; seeded). Prints Markdown; exit status 0 only if every check passes.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kit, also before `pip install -e .` knows it

import httpx  # noqa: E402

from loadkit.burst import honest, run_burst, summary  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8000", help="the running service (default: make serve's)")
    p.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY"), help="bearer key, if the service has keys")
    p.add_argument("--model", default=None, help="model id (default: the first /v1/models lists)")
    p.add_argument("--count", type=int, default=240, help="requests sent at once (default 240)")
    p.add_argument("--seed", type=int, default=15, help="seed of the request mix (default 15)")
    p.add_argument("--ttft-target", type=float, default=10.0,
                   help="the service's first-token target, s (default 10: deployment.ttft_target_s's default)")
    p.add_argument("--timeout", type=float, default=300.0, help="the SDK's timeout per request, s (default 300)")
    args = p.parse_args()
    try:
        result = asyncio.run(run_burst(args.base_url.rstrip("/"), args.count, args.seed, args.api_key, args.model,
                                       args.timeout, args.ttft_target))
    except httpx.HTTPError as err:
        print(f"burst: cannot reach the service at {args.base_url} ({type(err).__name__}: {err}); start it with "
              "`make serve`, or give --base-url (and --api-key if it has keys)", file=sys.stderr)
        return 2
    lines = summary(result)
    checks = honest(result)
    print("\n".join(["## Burst", "", *lines, "", *checks]))
    return 0 if all(c.startswith("- PASS") for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
