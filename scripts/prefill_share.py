#!/usr/bin/env python3
"""How a long prompt and the running streams share the engine, per engine.max_num_batched_tokens (issue 15).

    .venv/bin/python scripts/prefill_share.py                        # budgets 256, 512, 1024 and vLLM's 2048
    .venv/bin/python scripts/prefill_share.py --budgets 512,2048 --rounds 1 --trials 2

Per budget, a stack of its own (`python -m app serve`, configs/cpu.yaml otherwise; interleaved rounds): 8 short
streams decode, a long prompt (1,800 tokens) arrives and a short request right after it. Prints a Markdown table:
the streams' usual gap between tokens, the longest gap while the long prompt is prefilled (the stall it causes),
and the first token of the long prompt and of the short request. The work is done by loadkit.prefill_share.
On a shared machine wrap it: flock /tmp/realstack.lock .venv/bin/python scripts/prefill_share.py
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # the kit, also before `pip install -e .` knows it

from loadkit.prefill_share import Plan, run, table  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--budgets", default="256,512,1024,default",
                   help="comma-separated max_num_batched_tokens values; 'default' is vLLM's own")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--trials", type=int, default=3, help="trials per stack, after one warm-up (default 3)")
    p.add_argument("--long-prompt", type=int, default=1800, help="the long prompt's tokens (default 1800)")
    args = p.parse_args()
    budgets = [None if b.strip() == "default" else int(b) for b in args.budgets.split(",")]
    with tempfile.TemporaryDirectory(prefix="prefill-share-") as work:
        trials = run(Plan(repo=REPO, budgets=budgets, rounds=args.rounds, trials=args.trials,
                          long_prompt_tokens=args.long_prompt, work_dir=Path(work)))
    print("\n".join(table(trials)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
