"""ProgressWatch on a clock the test moves: the bound is what is in flight allows, a stall is declared past it
and not a moment before, any progress (the host's or the engine's counters) restarts the clock, and an engine
with nothing unfinished owes nothing."""

from __future__ import annotations

import pytest

from app.host.progress_watch import UNMEASURED_PREFILL_TOKENS_PER_S, ProgressWatch, Stall


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def watch(clock: Clock, **kw) -> ProgressWatch:
    kw = {"floor_s": 30.0, "margin": 2.0, **kw}
    return ProgressWatch(clock=clock, **kw)


def test_bound_is_floor_plus_margin_times_the_prompts_waiting_for_their_first_output(clock):
    w = watch(clock)
    assert w.bound_s(1000.0) == 30.0  # nothing in flight: the floor
    w.entered("a", 500)
    assert w.bound_s(1000.0) == pytest.approx(30.0 + 2.0 * 500 / 1000)
    for i in range(32):  # 32 prompts at the full context, none with an output yet
        w.entered(f"full-{i}", 2048)
    assert w.prefill_tokens() == 500 + 32 * 2048
    assert w.bound_s(1000.0) == pytest.approx(30.0 + 2.0 * (500 + 32 * 2048) / 1000)
    for i in range(16):  # outputs of half of them: their prompts are prefilled, and it is progress
        w.output(f"full-{i}")
    w.left("a")
    assert w.prefill_tokens() == 16 * 2048
    for i in range(16, 32):
        w.output(f"full-{i}")
    assert w.prefill_tokens() == 0 and w.bound_s(1000.0) == 30.0  # all decoding: the floor
    fresh = watch(clock)  # no rate measured yet
    fresh.entered("full", 2048)
    assert fresh.bound_s(None) == pytest.approx(30.0 + 2.0 * 2048 / UNMEASURED_PREFILL_TOKENS_PER_S)


def look(w: ProgressWatch, clock: Clock, seconds: float, tokens: int = 5, busy: bool = True,
         rate: float | None = 1000.0) -> Stall | None:
    """Moves the clock `seconds` on, looking every tick as the host does; the first stall seen, or None."""
    end = clock.now + seconds
    while clock.now < end - 1e-9:
        clock.now = min(end, clock.now + w.tick_s())
        stall = w.stalled(engine_progress=tokens, engine_busy=busy, prefill_tokens_per_s=rate)
        if stall is not None:
            return stall
    return None


def test_stall_declared_past_the_bound_and_not_before(clock):
    w = watch(clock)
    w.entered("a", 1000)
    w.entered("b", 1000)
    bound = w.bound_s(1000.0)
    assert w.stalled(engine_progress=5, engine_busy=True, prefill_tokens_per_s=1000.0) is None
    assert look(w, clock, bound - 0.01) is None
    stall = look(w, clock, 0.02)
    assert stall is not None
    assert stall.request_ids == ("a", "b") and stall.bound_s == pytest.approx(bound)
    assert stall.quiet_s == pytest.approx(bound + 0.01)
    assert "2 request(s)" in stall.describe()


def test_any_progress_restarts_the_clock(clock):
    w = watch(clock, floor_s=10.0)
    w.entered("a", 100)
    w.stalled(engine_progress=0, engine_busy=True, prefill_tokens_per_s=None)
    bound = w.bound_s(None)
    for tokens in range(1, 6):  # the engine's counters move every 0.9 bound: slow, never stalled
        assert look(w, clock, 0.9 * bound, tokens=tokens, rate=None) is None
    w.output("a")  # prefilled: the bound is the floor from now on
    bound = w.bound_s(None)
    assert bound == 10.0
    for _ in range(5):  # the host sees outputs every 0.9 bound, counters still
        assert look(w, clock, 0.9 * bound, rate=None) is None
        w.output("a")
    assert look(w, clock, 1.01 * bound, rate=None) is not None


def test_an_engine_with_nothing_unfinished_owes_nothing(clock):
    """Its requests wait for their readers (a slow client), not for the engine."""
    w = watch(clock, floor_s=1.0)
    w.entered("a", 100)
    assert look(w, clock, 50.0, busy=False) is None
    assert look(w, clock, 0.9 * w.bound_s(1000.0), busy=True) is None  # busy again: the clock runs from then


def test_nothing_in_flight_is_never_a_stall_and_an_arrival_into_an_idle_engine_starts_the_clock(clock):
    w = watch(clock, floor_s=1.0)
    assert look(w, clock, 100.0) is None
    clock.now += 100.0  # long idle, unobserved
    w.entered("a", 10)
    assert look(w, clock, 0.9 * w.bound_s(1000.0)) is None


def test_time_the_host_could_not_look_is_not_counted_against_the_engine(clock):
    """The host's loop blocked past the bound: its outputs, read on that loop, were late by as much."""
    w = watch(clock, floor_s=10.0)
    w.entered("a", 100)
    w.stalled(engine_progress=5, engine_busy=True, prefill_tokens_per_s=1000.0)
    assert look(w, clock, 5.0) is None
    clock.now += 60.0  # no look for a minute
    assert w.stalled(engine_progress=5, engine_busy=True, prefill_tokens_per_s=1000.0) is None
    assert look(w, clock, w.bound_s(1000.0) - 5.0 - 2 * w.tick_s() - 0.01) is None
    assert look(w, clock, 0.5) is not None  # a stall all the same, once the host looks again


def test_renewed_watch_keeps_the_settings_and_forgets_the_requests(clock):
    w = watch(clock, floor_s=7.0, margin=1.5)
    w.entered("a", 10)
    fresh = w.renewed()
    assert (fresh.floor_s, fresh.margin, fresh.in_flight, fresh.prefill_tokens()) == (7.0, 1.5, 0, 0)


def test_the_rate_trusted_is_the_slowest_reported_however_slow(clock):
    """Issue 27: rates under 100 tokens/s were raised to 100, so an engine prefilling at 30 tokens/s was declared
    wedged part-way through one long prompt."""
    w = watch(clock)
    w.entered("a", 2048)
    assert w.bound_s(1000.0) == pytest.approx(30.0 + 2.0 * 2048 / 1000)
    assert w.bound_s(50_000.0) == pytest.approx(30.0 + 2.0 * 2048 / 1000)  # a faster refit: the bound stays
    assert w.bound_s(None) == pytest.approx(30.0 + 2.0 * 2048 / 1000)
    assert w.bound_s(1.0) == pytest.approx(30.0 + 2.0 * 2048 / 1.0)  # followed down, never clamped


def test_a_slow_live_engine_is_not_wedged_while_a_stopped_one_still_is(clock):
    """An engine at 30 prompt tokens/s (measured) prefilling 2,000 tokens takes 67 s to its first output; the
    bound waits for it. One that stops making progress with nothing to prefill is found at the floor."""
    slow = watch(clock)
    slow.entered("long", 2000)
    assert look(slow, clock, 2000 / 30, rate=30.0) is None
    stopped = watch(clock)
    stopped.entered("decoding", 100)
    stopped.output("decoding")
    assert look(stopped, clock, 32.0, rate=30.0) is not None


def test_before_any_rate_is_measured_the_bound_assumes_a_slow_engine(clock):
    w = watch(clock)
    w.entered("first", 2000)
    assert UNMEASURED_PREFILL_TOKENS_PER_S <= 10
    assert look(w, clock, 2000 / 10, rate=None) is None


def test_a_request_that_was_waiting_on_a_wedged_engine_is_given_ten_times_the_prefill_time_on_the_next(clock):
    w = watch(clock)
    w.entered("again", 2000, patient=True)
    assert w.bound_s(100.0) == pytest.approx(30.0 + 2.0 * 20_000 / 100)


def test_kv_cache_use_moving_is_progress(clock):
    """A chunked prefill allocates KV blocks chunk by chunk with no output and no token counted."""
    w = watch(clock)
    w.entered("long", 100_000)
    for step in range(30):
        clock.now += 10.0
        assert w.stalled(engine_progress=(0, step / 100), engine_busy=True, prefill_tokens_per_s=1e9) is None
    assert w.renewed().bound_s(None) == pytest.approx(30.0)  # nothing in flight in the new one: the floor
