"""A light client in its own process: how fast does an overloaded service answer a newcomer?

The command line of `loadkit.probe` (see there): `scripts/overload.py` runs the same probe beside its load.

    python scripts/refusal_probe.py --base-url http://127.0.0.1:8000 --model NAME --duration 30 [--api-key KEY]

Prints (or writes with --out) JSON: per-outcome latency lists in seconds.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the kit, also before `pip install -e .` knows it

from loadkit.probe import main, probe  # noqa: E402  (`probe`: for callers that load this file)

__all__ = ["main", "probe"]

if __name__ == "__main__":
    sys.exit(main())
