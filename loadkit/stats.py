"""Percentiles, and pooling several load-generator runs into one set of figures.

Owns the arithmetic both reports share: percentiles are numpy's linear interpolation (what vLLM's own load
generator computes, and what the overload report always used), and pooling means all tokens over all run time
and percentiles over every request of every run, never a mean of per-run rates or of per-run percentiles.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


def percentile(values: Sequence[float], q: float) -> float | None:
    """The `q`-th percentile (0..100) of `values`, linear interpolation; None when there are none."""
    if len(values) == 0:
        return None
    return float(np.percentile(np.asarray(values, dtype=float), q))


def fmt_pcts(values: Sequence[float], scale: float = 1.0, unit: str = "", digits: int = 2,
             qs: Sequence[float] = (50, 90, 99)) -> str:
    """'p50 / p90 / p99<unit> (n=N)' (or the percentiles `qs`), each times `scale`; '-' for no values."""
    if len(values) == 0:
        return "-"
    return " / ".join(f"{percentile(values, q) * scale:.{digits}f}" for q in qs) + f"{unit} (n={len(values)})"


@dataclass
class PooledFigures:
    """One system at one concurrency, pooled over its runs (rounds). Latencies in ms."""

    repeats: int = 0
    completed: int = 0
    failed: int = 0
    duration_s: float = 0.0
    output_tok_s: float = 0.0
    req_s: float = 0.0
    total_output_tokens: int = 0
    output_tok_s_runs: list[float] = field(default_factory=list)  # each run's own throughput, in run order
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    e2el_p50_ms: float | None = None
    e2el_p99_ms: float | None = None
    errors: dict[str, int] = field(default_factory=dict)  # last line of each distinct error -> how many


def _ms(samples: list[float], q: float) -> float | None:
    value = percentile(samples, q)
    return None if value is None else value * 1000


def pool_runs(runs: list[dict]) -> PooledFigures:
    """Pools the detailed results of `vllm bench serve --save-detailed` (one dict per run): TTFT and E2E over
    every successful request, ITL over every token gap of every successful request."""
    ttfts: list[float] = []
    itls: list[float] = []
    e2els: list[float] = []
    distinct: dict[str, int] = {}
    for d in runs:
        for i, error in enumerate(d["errors"]):
            if error:
                key = error.strip().splitlines()[-1][:200] if error.strip() else "(empty)"
                distinct[key] = distinct.get(key, 0) + 1
                continue
            ttfts.append(d["ttfts"][i])
            itls.extend(d["itls"][i])
            e2els.append(d["latencies"][i])
    duration = sum(d["duration"] for d in runs)
    tokens = sum(d["total_output_tokens"] for d in runs)
    completed = sum(d["completed"] for d in runs)
    return PooledFigures(
        repeats=len(runs), completed=completed, failed=sum(d["failed"] for d in runs), duration_s=duration,
        output_tok_s=tokens / duration if duration else 0.0, req_s=completed / duration if duration else 0.0,
        total_output_tokens=tokens, output_tok_s_runs=[d["output_throughput"] for d in runs],
        ttft_p50_ms=_ms(ttfts, 50), ttft_p99_ms=_ms(ttfts, 99), itl_p50_ms=_ms(itls, 50), itl_p99_ms=_ms(itls, 99),
        e2el_p50_ms=_ms(e2els, 50), e2el_p99_ms=_ms(e2els, 99), errors=distinct)


def pool_result_files(paths: list[Path]) -> PooledFigures:
    return pool_runs([json.loads(Path(p).read_text()) for p in paths])


def ratio_text(a: float | None, b: float | None) -> str:
    """'a/b×' with two decimals, '–' when either is missing."""
    if a is None or b in (None, 0):
        return "–"
    return f"{a / b:.2f}×"


def spread_text(mine: list[float], theirs: list[float]) -> str:
    """The lowest and highest of run i's figure over run i's reference ('0.90–1.00×'); '–' below two runs."""
    ratios = [m / t for m, t in zip(mine, theirs, strict=False) if t]  # a round one side lacks is left out
    if len(ratios) < 2:
        return "–"
    return f"{min(ratios):.2f}–{max(ratios):.2f}×"
