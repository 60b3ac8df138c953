"""When a broken engine may be restarted in place, and how long a restart may take.

At most RESTART_LIMIT breaks within RESTART_WINDOW_S are restarted here; the next one is left to Ray Serve, which
replaces the replica (a new process may cure what a new engine in this one did not). A restart not done within
max(RESTART_MIN_DEADLINE_S, RESTART_DEADLINE_STARTS x the engine's last start) is not progressing: the health check
fails. Figures: docs/operations.md.
"""

from __future__ import annotations

import math
import time
from collections import deque

RESTART_LIMIT = 3
RESTART_WINDOW_S = 600.0
# The engine's start takes ~25 s on a 2-core CPU, ~110 s compiled on a GPU.
RESTART_MIN_DEADLINE_S = 180.0
RESTART_DEADLINE_STARTS = 4.0


class RestartBudget:
    """The engine's recent breaks, how long its last start took, and when the restart under way began."""

    def __init__(self) -> None:
        self.start_s = 0.0  # how long the engine's last start took, for Retry-After during a restart
        self._breaks: deque[float] = deque(maxlen=RESTART_LIMIT)
        self._restarting_since: float | None = None

    def broke(self) -> None:
        self._breaks.append(time.monotonic())

    def exhausted(self) -> bool:
        """RESTART_LIMIT breaks within RESTART_WINDOW_S: no restart here."""
        return len(self._breaks) == RESTART_LIMIT and time.monotonic() - self._breaks[0] < RESTART_WINDOW_S

    def restarting(self) -> None:
        self._restarting_since = time.monotonic()

    def started(self, start_s: float) -> None:
        """An engine started (the first, or a restart done), taking `start_s`."""
        self.start_s, self._restarting_since = start_s, None

    def deadline_s(self) -> float:
        return max(RESTART_MIN_DEADLINE_S, RESTART_DEADLINE_STARTS * self.start_s)

    def _elapsed_s(self) -> float:
        return 0.0 if self._restarting_since is None else time.monotonic() - self._restarting_since

    def retry_after_s(self) -> float:
        """The rest of the restart under way (or of a new one), if it takes as long as the last start did."""
        return float(min(60, max(1, math.ceil(self.start_s + 5 - self._elapsed_s()))))

    def overdue_s(self) -> float | None:
        """How long the restart under way has run past its deadline (None within it, or when none runs)."""
        elapsed = self._elapsed_s()
        return elapsed if self._restarting_since is not None and elapsed > self.deadline_s() else None
