"""EnginePace: the rates it learns from samples, and the waits it predicts from them."""

from __future__ import annotations

import random

import pytest

from app.host import rate_fit
from app.host.pace import MIN_SAMPLES, EnginePace, Work
from app.host.rate_fit import WINDOW


def _trained(prefill_s_per_token: float = 0.002, step_s: float = 0.01, per_batch_s: float = 0.005) -> EnginePace:
    """A pace fed an engine with known rates: first token = 0.05 + backlog * prefill + 0.01 * batch; decode
    = step + per_batch * batch seconds per token."""
    pace, rng = EnginePace(), random.Random(1)
    for _ in range(WINDOW):
        backlog, batch = rng.randint(10, 2000), rng.randint(1, 16)
        pace.first_token(backlog, batch, 0.05 + backlog * prefill_s_per_token + 0.01 * batch)
        pace.decoded(batch, 4, 4 * (step_s + per_batch_s * batch))
    return pace


def test_nothing_is_predicted_until_enough_requests_were_measured():
    pace = EnginePace()
    for i in range(MIN_SAMPLES - 1):
        pace.first_token(100, 1, 0.2)
        pace.decoded(1, 1, 0.01)
        assert pace.predict(Work(10, 10), [], [], 4) is None, i
    pace.first_token(100, 1, 0.2)
    assert pace.predict(Work(10, 10), [], [], 4) is not None


def test_a_first_batch_s_prefill_storm_teaches_no_decode_pace(monkeypatch):
    """A fresh replica's first batch prefills all its prompts between its first decode steps: those steps took 2.81 s
    a token where the batch decoded at 0.09 once the prefill was done (docs/overload.md). Samples taken while a
    prompt prefills are left out; only a replica that never takes a clean one learns from them, after 8 per slot."""
    monkeypatch.setattr(rate_fit, "_REFIT_SAMPLES", 1)  # every sample refits
    pace = EnginePace()
    for backlog in (100, 200, 300, 400):
        pace.first_token(backlog, 32, backlog * 0.01)
    for _ in range(40):
        pace.decoded(32, 1, 2.8, max_running=32, prefilling=True)
    assert not pace.ready  # nothing learnt of the decode yet: admission by count alone
    pace.decoded(32, 1, 0.09, max_running=32)
    assert pace.ready
    assert pace.output_tokens_per_s(32) == pytest.approx(32 / 0.09)
    never_clean = EnginePace()  # every sample beside a prefill: learnt from after 8 per slot
    for _ in range(8 * 4 + 1):
        never_clean.decoded(4, 1, 0.1, max_running=4, prefilling=True)
    assert never_clean.output_tokens_per_s(4) == pytest.approx(40)


def test_after_a_clean_sample_a_flood_s_prefill_teaches_no_decode_pace(monkeypatch):
    """A warm replica's decode steps beside a flood's first 32 prompts took 1.1 s a token where the batch decodes at
    0.15 (the prio suite's interactive flood, docs/tenants.md): learnt, they put every running stream's end a minute
    away, and an interactive arrival was refused for a first token predicted 52.9 s away that came within 3 s."""
    monkeypatch.setattr(rate_fit, "_REFIT_SAMPLES", 1)
    pace = EnginePace()
    for batch in (1, 2, 3, 4) * 8:
        pace.decoded(batch, 1, 0.01 + 0.004 * batch, max_running=32)
    before = pace.output_tokens_per_s(32)
    for _ in range(200):
        pace.decoded(32, 1, 1.1, max_running=32, prefilling=True)
    assert pace.output_tokens_per_s(32) == before


def test_the_prefill_a_running_stream_waits_through_is_added_to_its_end():
    """Decode is learnt without prefill, so a running stream's end adds the prompts still to prefill (at the
    first-token fit's rate) and, once the mix is known, the prompts that take the slots it and others free."""
    pace = _trained(prefill_s_per_token=0.002)
    decoding = Work(prompt_tokens=100, max_tokens=10, generated=5, started_s_ago=1.0, first_output=True)
    alone = pace.predict_queue([decoding], [Work(10, 10)], max_running=1)[0]
    prefilling = Work(prompt_tokens=1_000, max_tokens=10, started_s_ago=0.0)
    beside = pace.predict_queue([decoding, prefilling], [Work(10, 10)], max_running=2)[0]
    # the newcomer starts when `decoding` ends, 1,000 prompt tokens x 0.002 s later (the batch grew too)
    assert beside.start_s - alone.start_s >= 2.0
    for _ in range(40):  # a settled mix: 2 prompt tokens per output token
        pace.finished(generated=10, max_tokens=10, prompt_tokens=20)
    churned = pace.predict_queue([decoding], [Work(10, 10)], max_running=1)[0]
    # each of the 5 tokens left brings 2 prompt tokens to prefill for its batch of 1: + 5 x 2 x 0.002 s
    assert churned.start_s - alone.start_s == pytest.approx(5 * 2 * 0.002, rel=0.05)


def test_the_rates_are_recovered_from_the_samples():
    stats = _trained().stats(batch=8, max_running=32)
    assert stats.prefill_tokens_per_s == pytest.approx(500, rel=0.01)
    assert stats.decode_s_per_token == pytest.approx(0.01 + 0.005 * 8, rel=0.01)


def test_an_idle_engine_predicts_only_the_newcomers_own_prefill():
    prediction = _trained().predict(Work(prompt_tokens=1000, max_tokens=100), [], [], max_running=4)
    assert prediction is not None
    assert prediction.start_s == 0
    assert prediction.first_token_s == pytest.approx(0.05 + 1000 * 0.002 + 0.01, rel=0.02)
    assert prediction.finish_s == pytest.approx(prediction.first_token_s + 100 * 0.015, rel=0.02)


def test_a_full_engine_makes_the_newcomer_wait_for_the_first_slot_to_free():
    pace = _trained()
    running = [Work(100, 200, generated=g, started_s_ago=5, first_output=True) for g in (100, 150)]
    prediction = pace.predict(Work(100, 50), running, [], max_running=2)
    assert prediction is not None
    # batch 2: 0.02 s a token; the sooner one has 50 tokens left (output share 1.0 until requests finish)
    assert prediction.start_s == pytest.approx(50 * 0.02, rel=0.02)


def test_queued_prompts_ahead_add_their_prefill_to_the_newcomers_first_token():
    pace = _trained()
    alone = pace.predict(Work(100, 10), [], [], max_running=8)
    behind = pace.predict(Work(100, 10), [], [Work(1500, 10), Work(1500, 10)], max_running=8)
    assert alone is not None and behind is not None
    assert behind.first_token_s - alone.first_token_s == pytest.approx(3000 * 0.002, rel=0.05)


def test_the_estimates_follow_a_change_of_engine_speed():
    pace = _trained(step_s=0.01)
    slow = pace.stats(batch=4, max_running=32).decode_s_per_token
    for _ in range(WINDOW):  # the engine got four times faster
        pace.decoded(4, 4, 4 * 0.0075)
    fast = pace.stats(batch=4, max_running=32).decode_s_per_token
    assert slow == pytest.approx(0.03, rel=0.01) and fast == pytest.approx(0.0075, rel=0.05)


def test_the_expected_output_length_follows_what_requests_really_generate():
    pace = _trained()
    before = pace.predict(Work(10, 200), [], [], 4)
    for _ in range(50):
        pace.finished(generated=50, max_tokens=200)  # they stop at a quarter of max_tokens
    after = pace.predict(Work(10, 200), [], [], 4)
    assert before is not None and after is not None
    assert pace.stats(1, max_running=32).output_share == pytest.approx(0.25, abs=0.02)
    assert after.finish_s - after.first_token_s == pytest.approx((before.finish_s - before.first_token_s) / 4, rel=0.1)


def test_a_feature_without_spread_gets_no_negative_rate():
    pace = EnginePace()
    for backlog in range(10, 500, 10):  # always batch 1: its coefficient cannot be told
        pace.first_token(backlog, 1, 0.1 + backlog * 0.001)
        pace.decoded(1, 1, 0.02)
    prediction = pace.predict(Work(300, 1), [], [], 4)
    assert prediction is not None and prediction.first_token_s > 0


def test_a_window_at_one_batch_keeps_the_per_stream_rate_measured_across_batches():
    """The kept replica after a scale-down: 4 streams for a whole window. A fit of that window alone put its capacity
    at 16 streams at 52 tokens/s instead of 200 (the autoscaler then scaled straight back up)."""
    pace = _trained(step_s=0.08, per_batch_s=0.0)
    for _ in range(WINDOW):
        pace.decoded(4, 1, 0.08)
    assert pace.output_tokens_per_s(16) == pytest.approx(200, rel=0.02)


def test_a_window_at_one_batch_scales_the_shape_measured_across_batches_to_its_level():
    pace = _trained(step_s=0.01, per_batch_s=0.005)
    for _ in range(WINDOW):  # 4 streams run
        pace.decoded(4, 1, 0.01 + 0.005 * 4)
    for _ in range(WINDOW):  # ... and the engine gets twice slower (a noisy neighbour)
        pace.decoded(4, 1, 2 * (0.01 + 0.005 * 4))
    assert pace.stats(batch=16, max_running=32).decode_s_per_token == pytest.approx(2 * (0.01 + 0.005 * 16), rel=0.02)
    assert pace.stats(batch=1, max_running=32).decode_s_per_token == pytest.approx(2 * (0.01 + 0.005), rel=0.02)


def test_until_the_batch_has_varied_a_bigger_batch_is_predicted_slower():
    """Admission needs the pessimistic side before the engine has shown its per-stream cost: a fresh replica that
    saw one stream at a time, then a flood of 32."""
    pace = EnginePace()
    for _ in range(WINDOW):
        pace.decoded(1, 1, 0.02)
    one, full = pace.stats(batch=1, max_running=32), pace.stats(batch=32, max_running=32)
    assert full.decode_s_per_token > 4 * one.decode_s_per_token


def test_predictions_grow_by_how_late_admitted_requests_really_were():
    pace = _trained()
    before = pace.predict(Work(500, 10), [], [], 4)
    assert before is not None
    for _ in range(20):  # first tokens came twice as late as the model said (and sometimes three times)
        pace.observed(predicted_s=1.0, actual_s=2.0)
    pace.observed(predicted_s=1.0, actual_s=3.0)
    after = pace.predict(Work(500, 10), [], [], 4)
    assert after is not None
    assert 2.0 <= pace.lateness() <= 3.0
    assert after.first_token_s == pytest.approx(before.first_token_s * pace.lateness())
    assert after.model_first_token_s == pytest.approx(before.first_token_s)
    # Only the first token is late: the decode after it is the measured decode, not scaled again.
    assert after.finish_s - after.first_token_s == pytest.approx(before.finish_s - before.first_token_s)


def test_early_first_tokens_never_shrink_the_predictions():
    pace = _trained()
    for _ in range(20):
        pace.observed(predicted_s=2.0, actual_s=0.5)
    assert pace.lateness() == 1.0


def _light_load(pace: EnginePace, slope_s: float) -> None:
    """A window of 1-4 streams whose steps grow with the batch by `slope_s` per stream: the client's own work and
    the HTTP path share the engine's cores, so a light load's steps slow with each stream more than the engine's."""
    rng = random.Random(2)
    for _ in range(WINDOW):
        batch = rng.randint(1, 4)
        pace.decoded(batch, 1, 0.01 + slope_s * batch, max_running=32)


def test_capacity_measured_near_a_full_batch_is_kept_through_a_light_load(monkeypatch):
    """A light load's fit extrapolated to 32 streams put capacity at a third of what full batches measured, and the
    scale-down after a step wavered for minutes on it (docs/autoscaling.md)."""
    monkeypatch.setattr(rate_fit, "_REFIT_S", 0.0)  # every fit asked for is of the window as it is now
    pace = EnginePace()
    for batch in (16, 24, 32) * (WINDOW // 3):  # a full batch: 0.01 + 0.002 x batch per token
        pace.decoded(batch, 1, 0.01 + 0.002 * batch, max_running=32)
    full = pace.capacity(32)
    assert full == pytest.approx(32 / (0.01 + 0.002 * 32), rel=0.02)
    _light_load(pace, slope_s=0.01)
    assert pace.output_tokens_per_s(32) < full / 2  # the light window's own extrapolation
    assert pace.capacity(32) == full
    assert pace.stats(batch=2, max_running=32).capacity_tokens_per_s == pytest.approx(full, abs=0.1)


def test_a_full_batch_is_kept_though_nobody_asked_for_the_capacity_while_it_ran(monkeypatch):
    """The full-batch figure was kept only when `capacity` was asked while the window held a full batch: a /stats
    poll or an autoscaling report missing that moment lost it to the light load's extrapolation."""
    monkeypatch.setattr(rate_fit, "_REFIT_S", 0.0)
    pace = EnginePace()
    for batch in (16, 24, 32) * (WINDOW // 3):
        pace.decoded(batch, 1, 0.01 + 0.002 * batch, max_running=32)
    _light_load(pace, slope_s=0.01)
    assert pace.measured_full_batch
    assert pace.capacity(32) == pytest.approx(32 / (0.01 + 0.002 * 32), rel=0.02)
    assert pace.capacity(32) == pace.capacity(32)  # a query: asking twice changes nothing


def test_until_a_full_batch_was_measured_capacity_is_the_extrapolation_and_a_new_full_batch_replaces_it():
    pace = EnginePace()
    _light_load(pace, slope_s=0.01)
    assert pace.capacity(32) == pytest.approx(pace.output_tokens_per_s(32))
    for batch in (16, 24, 32) * (WINDOW // 3):  # full batches on an engine twice as slow (a noisy neighbour)
        pace.decoded(batch, 1, 2 * (0.01 + 0.002 * batch), max_running=32)
    assert pace.capacity(32) == pytest.approx(32 / (2 * (0.01 + 0.002 * 32)), rel=0.02)


def test_capacity_counts_prefill_at_the_engine_s_rate_not_the_queue_s_lateness():
    """The lateness corrects predicted waits in a queue; an overload's lateness of 4 would have cut capacity by
    the prefill's share four times over."""
    pace = _trained(prefill_s_per_token=0.002, step_s=0.01, per_batch_s=0.0)
    for _ in range(32):
        pace.finished(10, 10, prompt_tokens=20)  # 2 prompt tokens per output token
    before = pace.capacity(16)
    assert before == pytest.approx(1 / (0.01 / 16 + 0.002 * 2), rel=0.02)
    for _ in range(64):
        pace.observed(1.0, 4.0)  # admitted requests saw their first tokens 4x later than predicted
    assert pace.lateness() > 1 and pace.capacity(16) == pytest.approx(before)


def test_slots_are_engine_sequences_so_requests_of_n_4_fill_them_four_at_a_time():
    """Admission counts a request's choices as engine sequences (vLLM's `max_num_seqs`), so 8 requests of n 4 fill 32
    places. The prediction counted requests, saw 24 places free and put every newcomer's start at once: at the
    hostile run's start 23-25 non-readers of n 4 were queued that way, and a polite request waited behind them."""
    pace = _trained()
    holding = [Work(prompt_tokens=50, max_tokens=1_000, generated=1, started_s_ago=1.0, first_output=True, choices=4)
               for _ in range(8)]
    behind = pace.predict(Work(prompt_tokens=10, max_tokens=10), holding, [], max_running=32)
    assert behind is not None and behind.start_s > 1_000 * 0.01  # after a running one's 999 tokens left
    one_each = [Work(prompt_tokens=50, max_tokens=1_000, generated=1, started_s_ago=1.0, first_output=True)] * 8
    room = pace.predict(Work(prompt_tokens=10, max_tokens=10), one_each, [], max_running=32)
    assert room is not None and room.start_s == 0.0
    wide = pace.predict(Work(prompt_tokens=10, max_tokens=10, choices=4), one_each * 4, [], max_running=34)
    assert wide is not None and wide.start_s > 0.0  # 2 places free, 4 needed
