"""SteadyLoad against the in-process app on a real socket: what it records for served and refused answers, and
the options `loadkit capacity` measures with (one question, ignore_eos, a pause after a refusal)."""

from __future__ import annotations

import asyncio

from app.engine.fake import FakeEngine
from loadkit.steady_load import PLAIN, SERVED, SteadyLoad
from tests.support.fake_stack import MODEL_ID, Stack, listening, make_config


def _served(answers: int, base_url: str, **options) -> SteadyLoad:
    """A SteadyLoad run until `answers` are served, then stopped, all in a thread of its own: its clients block,
    and the app they talk to runs on the test's event loop."""
    with SteadyLoad(base_url, "none", MODEL_ID, **options) as load:
        load.wait_served(answers, timeout_s=30)
    return load


async def test_plain_answers_record_their_output_tokens_with_ignore_eos():
    stack = Stack(make_config(), FakeEngine(max_model_len=256))
    async with listening(stack) as base_url:
        load = await asyncio.to_thread(_served, 6, base_url, plain=2, streaming=1, max_tokens=20, question="Hi",
                                       ignore_eos=True)
    plain = [r for r in load.outcomes if r.kind == PLAIN]
    assert plain and all(r.outcome == SERVED and r.status is None for r in plain), [r.label for r in plain]
    assert {r.output_tokens for r in plain} == {20}  # every answer max_tokens long: ignore_eos reached the engine


async def test_refused_answers_record_429_and_the_client_pauses():
    config = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0, "queue_timeout_s": 5})
    stack = Stack(config, FakeEngine(max_model_len=256, token_delay_s=0.02))
    async with listening(stack) as base_url:
        load = await asyncio.to_thread(_served, 3, base_url, plain=3, streaming=0, max_tokens=20, ignore_eos=True,
                                       refused_pause_s=60)
    refused = [r for r in load.outcomes if r.status == 429]
    assert all(r.outcome != SERVED and r.output_tokens == 0 for r in refused)
    # Three clients on one slot and no queue: some are refused, and each refused client then waits out its pause
    # (longer than the test), so none is refused twice. Without the pause they would ask again at once, hundreds
    # of times.
    assert 1 <= len(refused) <= 3, [r.label for r in load.outcomes]
