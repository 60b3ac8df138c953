#!/usr/bin/env python3
"""The differential run against bare vLLM: this service and `python -m vllm.entrypoints.openai.api_server` (the
same install, model, served name and engine arguments, from configs/cpu.yaml) get the same requests, the curated
set and N property-generated ones, one at a time; the answers are compared field by field (ids, timestamps and
fingerprints aside), the verdicts counted and grouped by cause in docs/differential.md. Both are stopped at the
end, leaving no process behind. The work is done by `loadkit.differential`; this file is its command line.

    .venv/bin/python scripts/differential.py                  # 300 generated requests (make differential)
    .venv/bin/python scripts/differential.py --count 50 --seed 2

Raw verdicts (each request, both normalized answers, the mismatches) go to --work-dir/verdicts.jsonl
(default bench-results/differential-<timestamp>/, git-ignored), beside both servers' logs.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from loadkit.differential.run import Options, run  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--count", type=int, default=300, help="property-generated requests (default 300)")
    p.add_argument("--seed", type=int, default=1, help="the generator's seed (default 1)")
    p.add_argument("--time-budget-s", type=float, default=1200,
                   help="stop sending after this long, counting what was judged (default 1200)")
    p.add_argument("--report", type=Path, default=REPO / "docs" / "differential.md")
    p.add_argument("--work-dir", type=Path, default=None)
    args = p.parse_args(argv)
    work = args.work_dir or REPO / "bench-results" / f"differential-{time.strftime('%Y%m%d-%H%M%S')}"
    command = shlex.join(["python", "scripts/differential.py", *(argv if argv is not None else sys.argv[1:])])
    return run(Options(repo=REPO, count=args.count, seed=args.seed, time_budget_s=args.time_budget_s,
                       report=args.report, work=work.resolve(), command=command))


if __name__ == "__main__":
    sys.exit(main())
