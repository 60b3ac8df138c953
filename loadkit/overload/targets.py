"""The overload targets, PASS or FAIL, from one run's result."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from loadkit.overload.capacity import Capacity
from loadkit.overload.client import HUNG_GRACE_S, Record
from loadkit.overload.phases import Phase
from loadkit.overload.result import OverloadResult
from loadkit.overload.timing import TTFT_TOLERANCE_S, first_tokens, share_within
from loadkit.stats import percentile


@dataclass(frozen=True)
class Target:
    name: str
    ok: bool
    detail: str

    def line(self) -> str:
        return f"{'PASS' if self.ok else 'FAIL'}  {self.name}: {self.detail}"


def mib(b: int | None) -> str:
    return "-" if b is None else f"{b / 2**20:,.0f} MiB"


def codes(records: list[Record]) -> str:
    """'N (status code: n, ...)' of a set of unexpected answers; '0' for none."""
    if not records:
        return "0"
    c = Counter(f"{r.status or '-'} {r.code or ''}".strip() for r in records)
    return f"{len(records)} (" + ", ".join(f"{k}: {v}" for k, v in c.most_common()) + ")"


def _ms(values: list[float], q: float) -> float:
    return (percentile(values, q) or 0) * 1000


def refusal_target(result: OverloadResult) -> Target:
    # A newcomer's view, from the refusal probe in its own process; this driver's own clients share one event
    # loop with dozens of streams, and its lag (reported beside) is added to every latency they measure.
    overload = result.overload
    ref = overload.probe.refused
    mine = [r.latency for r in overload.of("refused")]
    p99 = percentile(ref, 99)
    name = "refusal p99 < 50 ms (a separate light client)"
    if p99 is None:
        return Target(name, False, "no refusal seen by the probe (overload not reached, or no probe)")
    return Target(name, p99 < 0.050,
                  f"p99 {p99 * 1000:.1f} ms over {len(ref)} refusals (p50 {_ms(ref, 50):.1f} ms); this script's "
                  f"clients: p50 {_ms(mine, 50):.1f} / p99 {_ms(mine, 99):.1f} ms over {len(mine)}, with their event "
                  f"loop lagging p99 {_ms(overload.watch.loop_lag, 99):.0f} ms")


def rss_target(result: OverloadResult) -> Target:
    capacity, overload = result.capacity, result.overload
    name = "overload RSS within 10% of at-capacity RSS"
    if not (capacity.rss_peak and overload.rss_peak):
        return Target(name, False, "no RSS measured (service process not found; pass --service-pid)")
    ratio = overload.rss_peak / capacity.rss_peak
    return Target(name, ratio <= 1.10, f"{mib(overload.rss_peak)} vs {mib(capacity.rss_peak)} "
                                       f"({(ratio - 1) * 100:+.1f}%; idle {mib(result.idle.rss_peak)})")


def throughput_targets(result: OverloadResult) -> list[Target]:
    out = []
    for label, attr, unit in (("output tokens/s", "tok_per_s", "tok/s"), ("requests/s", "req_per_s", "req/s")):
        a, b = getattr(result.capacity, attr), getattr(result.overload, attr)
        ratio = b / a if a else 0.0
        out.append(Target(f"overload served {label} >= 90% of at-capacity", ratio >= 0.90,
                          f"{b:.2f} vs {a:.2f} {unit} ({ratio * 100:.0f}%)"))
    return out


def ttft_target(target_s: float | None, phases: list[Phase]) -> Target | None:
    """Each loaded phase's admitted streams get their first token within the target + tolerance at p99; None
    (no target line) when the service has no time target."""
    if target_s is None:
        return None
    limit = target_s + TTFT_TOLERANCE_S
    name = f"admitted streams' first token p99 <= ttft_target_s + {TTFT_TOLERANCE_S:g} s (client clock)"
    parts, ok = [], True
    for p in phases:
        values = first_tokens(p.records)
        p99 = percentile(values, 99)
        ok = ok and p99 is not None and p99 <= limit
        parts.append(f"{p.name} " + ("no first token seen" if p99 is None else
                                     f"p99 {p99:.2f} s, {share_within(values, target_s) * 100:.1f}% within "
                                     f"{target_s:g} s (n={len(values)})"))
    return Target(name, ok, f"limit {limit:g} s; " + "; ".join(parts))


def queue_timeout_target(target_s: float | None, phases: list[Phase]) -> Target | None:
    """With a time target on, the predictor refuses at arrival; a 503 queue_timeout means it let one wait."""
    if target_s is None:
        return None
    counts = [(p.name, len(p.of("queue_timeout"))) for p in phases]
    served = [(p.after.refused_queue_timeout - p.before.refused_queue_timeout) for p in phases]
    return Target("no 503 queue_timeout while a time target is on (refused at arrival instead)",
                  all(n == 0 for _, n in counts),
                  ", ".join(f"{name} {n}" for name, n in counts)
                  + f"; server-counted {' / '.join(str(s) for s in served)}")


def time_targets(target_s: float | None, phases: list[Phase]) -> list[Target]:
    return [t for t in (ttft_target(target_s, phases), queue_timeout_target(target_s, phases)) if t is not None]


def evaluate(cap: Capacity, result: OverloadResult) -> list[Target]:
    capacity, overload = result.capacity, result.overload
    t: list[Target] = []
    bad = overload.of("error_5xx", "stream_error") + capacity.of("error_5xx", "stream_error")
    t.append(Target("no 5xx other than queue-full refusals and 503 queue timeouts (nor error events inside 200 "
                    "streams)", not bad,
                    f"overload {codes(overload.of('error_5xx', 'stream_error'))}, at capacity "
                    f"{codes(capacity.of('error_5xx', 'stream_error'))}; 503 queue timeouts counted apart: "
                    f"{len(overload.of('queue_timeout'))}"))
    transport = overload.of("transport") + capacity.of("transport")
    t.append(Target("no transport errors (connection refused/reset)", not transport, codes(transport)))
    hung = overload.of("hung") + capacity.of("hung")
    t.append(Target(f"zero hung requests (no answer within {cap.request_timeout_s + HUNG_GRACE_S:.0f} s)", not hung,
                    f"{len(hung)} hung"))
    t.append(Target("service alive (no OOM: service process and EngineCore alive, /health 200)", result.alive.ok,
                    result.alive.detail))
    t.append(refusal_target(result))
    t.extend(time_targets(cap.ttft_target_s, result.loaded))
    t.append(rss_target(result))
    t.extend(throughput_targets(result))
    idle = result.idle_after
    s = idle.stats
    t.append(Target("after overload: engine.running == 0 and admission.in_system == 0", idle.reached,
                    f"{'reached' if idle.reached else 'NOT reached'} in {idle.took_s:.1f} s (engine.running "
                    f"{s.engine_running}, admission.in_system {s.in_system}, waiting {s.waiting})"))
    t.append(Target("after overload: one normal request succeeds", result.normal.ok, result.normal.detail))
    if result.leftover is not None:
        left = result.leftover
        t.append(Target("no process left behind after stopping the service", not left,
                        "none" if not left else f"{len(left)} left and killed: {', '.join(left[:8])}"))
    return t
