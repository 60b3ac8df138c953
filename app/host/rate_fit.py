"""RateFit: a least-squares line over a window of recent samples, its rates kept non-negative, and a rate its window
cannot tell (its feature did not vary) held at the shape last measured (host/pace.py fits the engine's pace with it)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence

import numpy as np

WINDOW = 256  # samples per fit: recent enough to follow a change of speed, enough to be stable
# A fit is recomputed when asked for after _REFIT_S or _REFIT_SAMPLES new samples, whichever comes first: a
# least-squares over 256 rows costs ~30 us, and decode samples come once per token of every stream.
_REFIT_S = 0.25
_REFIT_SAMPLES = 32


class RateFit:
    """y ~ x @ coef over the last WINDOW samples, coefficients kept non-negative (a rate cannot be)."""

    def __init__(self, min_spread: tuple[float, ...]):
        self._rows: deque[tuple[float, ...]] = deque(maxlen=WINDOW)
        self._features = len(min_spread)
        # A feature whose values in the window spread less than its min_spread (standard deviation) cannot tell its
        # rate: least squares splits the time between it and the intercept at random (numpy's minimum norm). A
        # replica serving 4 streams for 5 s put its 16-stream capacity at 52 tokens/s instead of 200 that way, and the
        # autoscaler scaled back up right after a scale-down (the local cluster's flap). Such a window keeps the
        # shape last measured with spread (`_shape`: the intercept and those rates) and fits only its level. Until
        # one is measured, least squares as it falls: pessimistic at batches not seen yet, which admission needs (a
        # step taken as the same at any batch admitted the polite client at the hostile run's start, then refused
        # it late: first 200 after 24.8 s instead of 12.5 s, docs/tenants.md).
        self._min_spread = min_spread
        self._shape: np.ndarray | None = None
        self._coef: np.ndarray | None = None
        self._fitted_at = -1.0
        self._new = 0  # samples since the last fit

    def add(self, x: Sequence[float], y: float) -> None:
        if self._new >= WINDOW // 2:  # fitted at least once a half window, asked or not: `_shape` sees every window
            self._refit(time.monotonic())
        self._rows.append((*x, y))
        self._new += 1

    def __len__(self) -> int:
        return len(self._rows)

    def coef(self) -> np.ndarray | None:
        now = time.monotonic()
        stale = self._coef is None or now - self._fitted_at >= _REFIT_S or self._new >= _REFIT_SAMPLES
        if self._new and stale:
            self._refit(now)
        return self._coef

    def _refit(self, now: float) -> None:
        self._coef, self._fitted_at, self._new = self._fit(), now, 0

    def _fit(self) -> np.ndarray | None:
        """Least squares; the intercept and the rates of features without spread scaled together from `_shape`; a
        rate that comes out negative (too little spread to tell) is dropped and the rest refitted, so that none is."""
        if not self._rows:
            return None
        data = np.asarray(self._rows, dtype=float)
        x = np.column_stack([np.ones(len(data)), data[:, : self._features]])
        y = data[:, self._features]
        lacking = [i for i in range(1, self._features + 1) if float(np.std(x[:, i])) < self._min_spread[i - 1]]
        held = lacking if self._shape is not None else []
        shape = self._shape[[0, *held]] if self._shape is not None and held else np.ones(1)
        x[:, 0] = x[:, [0, *held]] @ shape  # the level: one factor for the intercept and the held rates
        if not x[:, 0].any():
            x[:, 0], shape = 1.0, np.eye(len(shape))[0]
        active = [0, *(i for i in range(1, self._features + 1) if i not in held)]
        while True:
            fitted = np.zeros(self._features + 1)
            fitted[active] = np.linalg.lstsq(x[:, active], y, rcond=None)[0]
            negative = [i for i in active if i > 0 and fitted[i] < 0]
            if not negative:
                break
            active.remove(min(negative, key=lambda i: fitted[i]))
        coef = fitted.copy()
        coef[[0, *held]] = fitted[0] * shape
        if not lacking:
            self._shape = coef
        return coef

    def at(self, *x: float) -> float | None:
        coef = self.coef()
        if coef is None:
            return None
        return float(coef[0] + sum(c * v for c, v in zip(coef[1:], x, strict=True)))
