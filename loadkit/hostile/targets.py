"""The hostile run's targets, PASS or FAIL, from its result.

- the polite client is served (a 200) within `write_stall_timeout_s` + `serve_grace_s` of the attack's start,
  and never goes longer without a 200 while the attack lasts than that plus the longest time a non-reader's
  kernel kept accepting bytes (its window open: the server cannot tell such a client from one that reads);
- the event-loop lag p99 is under 50 ms (its bucket bound, over the whole attack, from /metrics deltas);
- memory bounded: the replica's RSS never above 1.25 x its RSS before the attack;
- descriptors bounded: the replica's open descriptors never above its count before the attack plus one per
  hostile socket plus 64 (no connection costs more than one, nothing multiplies), and back within 16 of that
  count once the service is idle (nothing leaked);
- every idle, slowloris and huge-header socket ended by the server within `header_timeout_s` + 3 s;
- every non-reader ended by the server before the attack was over, and within `write_stall_timeout_s` +
  `serve_grace_s` of the last byte its kernel accepted (the write-stall clock's promise);
- nothing lost or hung: no giant prompt or /tokenize request without an answer within the timeout; idle
  (engine.running 0, admission.in_system 0) within `settle_timeout_s`; every polite request after the attack
  served; a normal chat answers "Paris"; an own service leaves no process behind.
"""

from __future__ import annotations

from loadkit.hostile.figures import (
    counts_text,
    kind_figures,
    lag_figures,
    mib,
    polite_figures,
    replica_figures,
    secs,
)
from loadkit.hostile.floods import GIANT, TOKENIZE, counts
from loadkit.hostile.lag import seconds_text
from loadkit.hostile.plan import HUGE_FAST, HUGE_SLOW, IDLE, NON_READER, SLOWLORIS
from loadkit.hostile.result import HostileResult
from loadkit.overload.targets import Target  # one Target (PASS/FAIL line) for every driver's report

LAG_P99_S = 0.050
RSS_FACTOR = 1.25
FD_MARGIN, FD_LEAK_MARGIN = 64, 16
HEADER_GRACE_S = 3.0




def _accepting_s(r: HostileResult) -> float:
    """The longest any non-reader's kernel kept accepting bytes after it connected."""
    return max((t for rec in r.of(NON_READER) if (t := rec.accepted_for()) is not None), default=0.0)


def polite_targets(r: HostileResult) -> list[Target]:
    bound = r.clocks.write_stall_timeout_s + r.plan.serve_grace_s
    accepting = _accepting_s(r)
    stretch = accepting + bound
    p = polite_figures(r)
    got = p.served_again_s
    return [
        Target(f"polite client served within write_stall_timeout_s + {r.plan.serve_grace_s:g} s = {bound:g} s of the "
               "attack's start", got is not None and got <= bound,
               f"first 200 {got:.1f} s after the attack began" if got is not None else
               "never served during the run after the attack began"),
        Target(f"polite client never without a 200 for longer than the non-readers' accepting time + "
               f"write_stall_timeout_s + {r.plan.serve_grace_s:g} s = {stretch:.1f} s during the attack",
               p.longest_unserved_s <= stretch,
               f"longest stretch without a 200 {p.longest_unserved_s:.1f} s (a non-reader's kernel accepted bytes "
               f"for up to {accepting:.1f} s); during the attack {counts_text(p.during)}"),
    ]


def lag_target(r: HostileResult) -> Target:
    name = f"event-loop lag p99 < {LAG_P99_S * 1000:g} ms (app_event_loop_lag_seconds, bucket bound)"
    f = lag_figures(r)
    if f is None or f.p99_bound_s is None:
        return Target(name, False, "no lag histogram on /metrics (or no heartbeat in the window)")
    lo, hi = f.max_range_s or (0.0, 0.0)
    return Target(name, f.p99_bound_s <= LAG_P99_S,
                  f"p99 <= {seconds_text(f.p99_bound_s)}, max in ({seconds_text(lo)}, {seconds_text(hi)}], mean "
                  f"{(f.mean_s or 0) * 1000:.1f} ms over {f.heartbeats:.0f} heartbeats; worst 10 s window p99 <= "
                  f"{seconds_text(f.worst_window_p99_s)}")


def memory_targets(r: HostileResult) -> list[Target]:
    f = replica_figures(r)
    names = (f"memory bounded: replica RSS <= {RSS_FACTOR:g} x its RSS before the attack",
             f"descriptors bounded: replica fds <= before + hostile sockets + {FD_MARGIN}, and <= before + "
             f"{FD_LEAK_MARGIN} once idle")
    if f is None:
        return [Target(n, False, "the replica process was not found (no samples)") for n in names]
    fd_cap = f.baseline_fds + r.plan.hostile_sockets + FD_MARGIN
    back = f.end_fds is not None and f.end_fds <= f.baseline_fds + FD_LEAK_MARGIN
    return [
        Target(names[0], f.peak_rss <= RSS_FACTOR * f.baseline_rss,
               f"before {mib(f.baseline_rss)}, peak {mib(f.peak_rss)} ({f.peak_rss / f.baseline_rss:.2f}x, at "
               f"{secs(f.peak_rss_at_s, 0)}), once idle {mib(f.end_rss)}"),
        Target(names[1], f.peak_fds <= fd_cap and back,
               f"before {f.baseline_fds}, peak {f.peak_fds} (cap {fd_cap}; peak server-side connections "
               f"{f.peak_connections}), once idle {f.end_fds if f.end_fds is not None else '-'}"),
    ]


def socket_targets(r: HostileResult) -> list[Target]:
    bound = r.clocks.header_timeout_s + HEADER_GRACE_S
    out = []
    for kinds, name, limit in (((IDLE, SLOWLORIS, HUGE_FAST, HUGE_SLOW),
                                f"idle, slowloris and huge-header sockets ended by the server within "
                                f"header_timeout_s + {HEADER_GRACE_S:g} s = {bound:g} s", bound),
                               ((NON_READER,), "every non-reader ended by the server before the attack was over",
                                None)):
        figs = [kind_figures(r, k) for k in kinds]
        figs = [f for f in figs if f.planned]
        ok = bool(figs) and all(f.all_ended and (limit is None or (f.max_s or 0) <= limit) for f in figs)
        detail = "; ".join(f"{f.kind}: {f.ended}/{f.connected} ended, max {secs(f.max_s)}" for f in figs)
        out.append(Target(name, ok, detail or "none planned"))
    return out


def stall_clock_target(r: HostileResult) -> Target:
    bound = r.clocks.write_stall_timeout_s + r.plan.serve_grace_s
    recs = [rec for rec in r.of(NON_READER) if rec.opened_at is not None]
    cuts = [t for rec in recs if (t := rec.cut_after_last_byte()) is not None]
    late = [t for t in cuts if t > bound]
    return Target(f"every non-reader ended within write_stall_timeout_s + {r.plan.serve_grace_s:g} s = {bound:g} s "
                  "of the last byte its kernel accepted", len(cuts) == len(recs) and not late,
                  f"{len(cuts)}/{len(recs)} ended; from the last accepted byte to the end: max "
                  f"{secs(max(cuts, default=None))}; over the bound: {len(late)}")


def after_targets(r: HostileResult) -> list[Target]:
    answers = r.attack.answers
    hung = [a for a in answers if a.error == "hung"]
    giant, flood = [a for a in answers if a.kind == GIANT], [a for a in answers if a.kind == TOKENIZE]
    idle, last = r.idle_after, r.idle_after.last
    seen = (f"engine.running {last.engine_running}, admission.in_system {last.in_system}" if last
            else "/stats unreadable")
    p = polite_figures(r)
    out = [
        Target("no giant prompt or /tokenize request hung (each answered within the timeout)", not hung,
               f"giant prompts {counts_text(counts(giant))}; /tokenize {counts_text(counts(flood))}"),
        Target(f"after: engine.running == 0 and admission.in_system == 0 within {r.plan.settle_timeout_s:g} s",
               idle.reached, f"{'reached' if idle.reached else 'NOT reached'} in {idle.took_s:.1f} s ({seen})"),
        Target("after: every polite request served", p.after_all_ok, counts_text(p.after)),
        Target('after: a normal chat (temperature 0) answers "Paris"', r.paris.ok, r.paris.detail),
    ]
    if r.leftover is not None:
        out.append(Target("no process left behind after stopping the service", not r.leftover,
                          "none" if not r.leftover else f"{len(r.leftover)} killed: {', '.join(r.leftover[:6])}"))
    return out


def evaluate(r: HostileResult) -> list[Target]:
    return [*polite_targets(r), lag_target(r), *memory_targets(r), *socket_targets(r), stall_clock_target(r),
            *after_targets(r)]
