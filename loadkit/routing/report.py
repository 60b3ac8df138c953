"""The routing benchmark's report: one table row per workload and system, the targets of issue 24 as ratios to the
power-of-two router measured in the same run, and a plot of TTFT and prefix-cache hit rate."""

from __future__ import annotations

from pathlib import Path

from loadkit.routing.figures import Row
from loadkit.routing.workloads import TITLES

BASELINE = "power_of_two"
RAY_SHIPPED = "ray_prefix_router"
LABELS = {"earliest_first_token": "this router (earliest first token)", "power_of_two": "power of two (Serve's)",
          RAY_SHIPPED: "Ray Serve LLM, PrefixCacheAffinityRouter as shipped",
          "ray_prefix_router_balanced": "Ray Serve LLM, PrefixCacheAffinityRouter, load fallback at 2",
          "vllm_router": "vllm-router, cache_aware, 2 bare vLLM servers"}


def _s(value: float | None, digits: int = 2) -> str:
    return "–" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{100 * value:.0f} %"


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def targets(rows: dict[str, dict[str, Row]], mine: str = "earliest_first_token") -> list[str]:
    """Issue 24's targets, each with its measured ratio and whether it is met."""
    out = []

    def check(what: str, value: float | None, bound: float, below: bool) -> None:
        ok = None if value is None else (value <= bound if below else value >= bound)
        verdict = "–" if ok is None else ("met" if ok else "NOT met")
        out.append(f"- {what} (target {'≤' if below else '≥'} {bound:g}): {_s(value)}× ({verdict})")

    for w in ("W1", "W2"):
        if w in rows and mine in rows[w] and BASELINE in rows[w]:
            a, b = rows[w][mine], rows[w][BASELINE]
            ttft = _ratio(a.ttft(50), b.ttft(50))
            hits = _ratio(a.hit_rate(), b.hit_rate())
            check(f"{w} TTFT p50, this router / power of two", ttft, 0.5, below=True)
            check(f"{w} prefix-cache hit rate, this router / power of two", hits, 1.8, below=False)
    if "W4" in rows and mine in rows["W4"] and BASELINE in rows["W4"]:
        p99 = _ratio(rows["W4"][mine].ttft(99), rows["W4"][BASELINE].ttft(99))
        check("W4 TTFT p99, this router / power of two", p99, 1.0, below=True)
    if "W4" in rows and mine in rows["W4"] and RAY_SHIPPED in rows["W4"]:
        p99 = _ratio(rows["W4"][mine].ttft(99), rows["W4"][RAY_SHIPPED].ttft(99))
        check("W4 TTFT p99, this router / Ray's prefix router as shipped", p99, 1.0, below=True)
    if "W3" in rows and mine in rows["W3"] and BASELINE in rows["W3"]:
        tps = _ratio(rows["W3"][mine].tokens_per_s(), rows["W3"][BASELINE].tokens_per_s())
        check("W3 output tokens/s, this router / power of two", tps, 0.97, below=False)
    decisions = [r.decision_p99_s for per in rows.values() for r in per.values() if r.decision_p99_s is not None]
    if decisions:
        worst = max(decisions) * 1000
        cpu = [r.decision_cpu_p99_s for per in rows.values() for r in per.values() if r.decision_cpu_p99_s is not None]
        own = f"; on the deciding thread's CPU {max(cpu) * 1000:.2f} ms (the rest: waits for a core or the GIL)" \
            if cpu else ""
        out.append(f"- The router's decision time p99 (worst workload): {worst:.2f} ms (target < 2 ms: "
                   f"{'met' if worst < 2 else 'NOT met'}){own}")
    return out


def section(rows: dict[str, dict[str, Row]], header: str, systems: list[str]) -> str:
    lines = [header, "",
             "| Workload | System | Requests | Failed | TTFT p50 / p99 (s) | E2E p50 / p99 (s) | Output tok/s "
             "| Prefix-cache hit rate | Busiest replica's share | Routing precision | Measured / predicted TTFT |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for workload, per in rows.items():
        for system in systems:
            r = per.get(system)
            if r is None:
                continue
            lines.append(
                f"| {workload} {TITLES.get(workload, '')} | {LABELS.get(system, system)} | {len(r.outcomes)} "
                f"| {r.failed()} | {_s(r.ttft(50))} / {_s(r.ttft(99))} | {_s(r.e2e(50))} / {_s(r.e2e(99))} "
                f"| {_s(r.tokens_per_s(), 1)} | {_pct(r.hit_rate())} | {_pct(r.busiest_share())} "
                f"| {_pct(r.precision())} | {_s(r.first_token_bias())} |")
    lines += ["", "Against the targets (ratios within this run):", "", *targets(rows), "",
              "![TTFT p50 and prefix-cache hit rate per workload and system](routing.png)"]
    return "\n".join(lines)


def plot(rows: dict[str, dict[str, Row]], systems: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(rows)
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        xs = [k + i * width for k in range(len(workloads))]
        ttft = [rows[w][system].ttft(50) or 0 if system in rows[w] else 0 for w in workloads]
        hits = [100 * (rows[w][system].hit_rate() or 0) if system in rows[w] else 0 for w in workloads]
        left.bar(xs, ttft, width, label=LABELS.get(system, system))
        right.bar(xs, hits, width, label=LABELS.get(system, system))
    for axis, title in ((left, "TTFT p50 (s)"), (right, "prefix-cache hit rate (%)")):
        axis.set_xticks([k + width * (len(systems) - 1) / 2 for k in range(len(workloads))], workloads)
        axis.set_title(title)
    left.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
