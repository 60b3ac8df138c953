#!/usr/bin/env python
"""Chaos on the local multi-node cluster: steady load while each fault of issue 13 is injected in turn (engine
SIGKILL, engine SIGSTOP, replica SIGKILL, node loss, rolling update); per fault, the answers, failures, long
streams whole, choices moved, retries, the longest wait a client saw and the time until the deployment is whole.
The work is done by `loadkit.chaos`; this file is its command line. About 15 minutes on two cores.

    .venv/bin/python scripts/chaos.py                          # every fault; the table into docs/chaos.md
    .venv/bin/python scripts/chaos.py --faults node-loss --output -
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from loadkit.chaos.run import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
