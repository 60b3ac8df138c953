"""The report of `python -m loadkit fairness`: an `Outcome` per suite and system, its tables (Markdown), the
per-window table and the plot of weighted service over time (a small hand-written SVG: polylines, no
dependencies).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from html import escape
from itertools import accumulate

from loadkit.fairness import account
from loadkit.fairness.account import Answer, Gap, Overrun
from loadkit.fairness.plan import Capacity, Suite, System

COLOURS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728")


@dataclass
class Outcome:
    """One suite under one system: its answers, and the figures read from them."""

    suite: Suite
    system: System
    answers: list[Answer]
    window: float

    @property
    def weights(self) -> dict[str, float]:
        return {c.name: c.weight for c in self.suite.senders(self.system)}

    @cached_property
    def service(self) -> dict[str, list[float]]:
        return account.service_per_window(self.answers, self.weights, self.window, self.suite.seconds)

    @cached_property
    def gap(self) -> Gap:
        backlog = {c: account.backlogged(self.answers, c, self.window, self.suite.seconds) for c in self.weights}
        return account.largest_gap(self.service, backlog)

    @cached_property
    def output_tok_s(self) -> float:
        return account.output_tok_s(self.answers, self.suite.seconds)

    def of(self, client: str) -> list[Answer]:
        return [a for a in self.answers if a.client == client]


def _codes(counts: dict[str, int]) -> str:
    total = sum(counts.values())
    return f"{total} ({', '.join(f'{c} {n}' for c, n in sorted(counts.items(), key=lambda x: -x[1]))})" \
        if total else "0"


def _solo(outcomes: list[Outcome]) -> dict[tuple[str, float, str], list[Answer]]:
    """Each client's answers when it sent alone, by (suite, length, client)."""
    return {(o.suite.key, o.suite.seconds, o.system.alone): o.of(o.system.alone) for o in outcomes if o.system.alone}


def tenant_table(outcomes: list[Outcome]) -> list[str]:
    """A row per suite, system and tenant; beside each first token, the tenant's own when it sent alone."""
    lines = ["| suite | system | tenant (weight, load) | sent | answered | refused or failed (codes) | "
             "first token p50 / p99 (s) | alone: first token p50 / p99 (s) | output tok/s | "
             "weighted service/s (share) |",
             "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: |"]
    solo = _solo(outcomes)
    for o in outcomes:
        totals = {c: sum(v) / o.suite.seconds for c, v in o.service.items()}
        everyone = sum(totals.values()) or 1.0
        for c in o.suite.senders(o.system):
            mine = o.of(c.name)
            answered = sum(1 for a in mine if a.status == 200)
            alone = solo.get((o.suite.key, o.suite.seconds, c.name))
            lines.append(
                f"| {o.suite.key} ({o.suite.seconds:g} s) | {o.system.name} | {c.name} ({c.weight:g}, {c.load:g}x"
                f"{', batch' if c.name in o.system.batch else ''}) | {len(mine)} | {answered} | "
                f"{_codes(account.refusals(mine))} | {account.first_token_text(mine)} | "
                f"{account.first_token_text(alone) if alone is not None and not o.system.alone else '-'} | "
                f"{account.output_tok_s(mine, o.suite.seconds):.0f} | "
                f"{totals[c.name]:.0f} ({totals[c.name] / everyone:.0%}) |")
    return lines


def summary_table(outcomes: list[Outcome], capacity: Capacity) -> list[str]:
    """A row per suite and system: throughput against first-come's, and the largest backlogged gap."""
    lines = ["| suite | system | length (s) | output tok/s | vs first-come | largest gap between backlogged tenants "
             "(weighted tokens) | in seconds of the whole replica | over (windows), largest in 1st / 2nd half |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    first_come = {(o.suite.key, o.suite.seconds): o.output_tok_s for o in outcomes if o.system.name == "first-come"}
    for o in outcomes:
        base = first_come.get((o.suite.key, o.suite.seconds)) or 0  # only a run of the same length compares
        ratio = f"{o.output_tok_s / base:.2f}x" if base else "-"
        g = o.gap
        stretch = (f"{g.pair[0]}-{g.pair[1]} over {g.windows}: {g.first_half:.0f} / {g.second_half:.0f}"
                   if g.windows else "never both backlogged")
        lines.append(f"| {o.suite.key} | {o.system.name} | {o.suite.seconds:g} | {o.output_tok_s:.0f} | {ratio} | "
                     f"{g.largest:.0f} | {g.largest / capacity.service_s:.1f} | {stretch} |")
    return lines


def window_table(outcomes: list[Outcome], suite: str) -> list[str]:
    """Weighted service per window of one suite, each system and tenant a row (thousands of VTC units)."""
    chosen = [o for o in outcomes if o.suite.key == suite]
    if not chosen:
        return []
    n = len(next(iter(chosen[0].service.values())))
    w = chosen[0].window
    heads = " | ".join(f"{k * w:g}-{(k + 1) * w:g} s" for k in range(n))
    lines = [f"| system | tenant | {heads} |", "| --- | --- |" + " ---: |" * n]
    for o in chosen:
        for c, values in o.service.items():
            lines.append(f"| {o.system.name} | {c} | " + " | ".join(f"{v / 1000:.1f}" for v in values) + " |")
    return lines


def overrun_table(o: Overrun, count: int) -> list[str]:
    return ["| tokens_per_minute | requests at once | answered | refused (codes) | tokens used (usage) | overrun | "
            "requests the budget holds by real use |",
            "| ---: | ---: | ---: | --- | ---: | ---: | ---: |",
            f"| {o.budget} | {count} | {o.answered} | {_codes(o.refused)} | {o.used} | **{o.overrun}** | {o.fits} |"]


def svg(outcomes: list[Outcome], title: str, panel_w: int = 230, panel_h: int = 150) -> str:
    """Cumulative weighted service per tenant over time: a row of panels per suite, a column per system; the
    y-axis shared along a row."""
    suites = list(dict.fromkeys(o.suite.key for o in outcomes))
    columns = max((sum(1 for o in outcomes if o.suite.key == s) for s in suites), default=1)
    left, top, gap_x, gap_y = 20, 40, 20, 40
    width, height = left + columns * (panel_w + gap_x), top + len(suites) * (panel_h + gap_y)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="{left}" y="18" font-size="13">{escape(title)}</text>']
    for row, s in enumerate(suites):
        chosen = [o for o in outcomes if o.suite.key == s]
        curves = [{c: [0.0, *accumulate(v)] for c, v in o.service.items()} for o in chosen]
        peak = max((max(v) for cs in curves for v in cs.values()), default=0.0) or 1.0
        for col, (o, cs) in enumerate(zip(chosen, curves, strict=True)):
            x0, y0 = left + col * (panel_w + gap_x), top + row * (panel_h + gap_y)
            out.append(f'<text x="{x0}" y="{y0 - 6}">{escape(f"{s} {o.system.name}")}</text>')
            out.append(f'<rect x="{x0}" y="{y0}" width="{panel_w}" height="{panel_h}" fill="none" stroke="#999"/>')
            out.append(f'<text x="{x0 + panel_w}" y="{y0 + panel_h + 12}" text-anchor="end">'
                       f'{o.suite.seconds:g} s; top {peak / 1000:.0f}k</text>')
            for i, (c, values) in enumerate(cs.items()):
                points = " ".join(f"{x0 + min(k * o.window, o.suite.seconds) / o.suite.seconds * panel_w:.1f},"
                                  f"{y0 + panel_h - v / peak * panel_h:.1f}" for k, v in enumerate(values))
                colour = COLOURS[i % len(COLOURS)]
                out.append(f'<polyline points="{points}" fill="none" stroke="{colour}" stroke-width="1.5"/>')
                out.append(f'<text x="{x0 + 6 + 28 * i}" y="{y0 + 14}" fill="{colour}">{escape(c)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"
