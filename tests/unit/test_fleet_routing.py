"""The fleet router (app/routing/): each request to the replica predicted to give its first token soonest, counting
its queue and the prefill of what its prefix cache does not hold.

First on replicas' figures as they report them (`ReplicaLoad`), then end to end on in-process fleets of fake engines
with a cost model (tests/support/fake_fleet.py): prefill time per uncached token, one prompt at a time, a prefix cache
of whole blocks."""

from __future__ import annotations

import random

import httpx
import pytest

from app.engine.fake import FakeEngine
from app.engine.interface import Admitted, GenerationDelta, PromptInput
from app.engine.prefix_blocks import BlockLRU, block_hashes, cacheable_blocks
from app.errors import OverTimeTarget
from app.host.replica_load import ReplicaLoad
from app.http.ingress import create_app
from app.routing.fleet_router import FleetRouter
from tests.support.fake_fleet import FakeFleet
from tests.support.fake_stack import make_request

BLOCK = 16


def _load(wait_s: float | None = 0.2, rate: float | None = 1e-3, in_system: int = 1, **more) -> ReplicaLoad:
    return ReplicaLoad(wait_s=wait_s, prefill_s_per_token=rate, per_request_s=0.01 if rate else None,
                       in_system=in_system, room=10, block_tokens=BLOCK, cache_blocks=1000, **more)


def _ids(seed: int, tokens: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(tokens)]


def _sent_and_answered(router: FleetRouter, loads, ids, cached: int | None = None) -> str:
    """Routes `ids`, reports its first output with `cached` tokens (default: what the router predicted), and its end."""
    decision = router.choose(loads, ids)
    assert decision is not None and decision.refusal is None
    best = decision.candidates[0]
    router.answered(decision, best.replica, best.cached_tokens if cached is None else cached, 0.1)
    router.finished(decision)
    return best.replica


def test_block_names_chain_the_prefix_and_the_last_token_is_never_a_hit():
    a, b = _ids(1, 100), _ids(2, 100)
    assert len(block_hashes(a, BLOCK)) == 6  # whole blocks only
    shared = block_hashes(a[:64] + b[64:], BLOCK)
    assert shared[:4] == block_hashes(a, BLOCK)[:4] and shared[4] != block_hashes(a, BLOCK)[4]
    assert block_hashes(b[:16] + a[16:], BLOCK)[1] != block_hashes(a, BLOCK)[1]  # a name stands for all before it
    assert cacheable_blocks(32, BLOCK) == 1 and cacheable_blocks(33, BLOCK) == 2
    lru = BlockLRU(capacity=4)
    lru.add(block_hashes(a, BLOCK))
    assert len(lru) == 4 and lru.match(block_hashes(a, BLOCK)) == 0  # the oldest (the prefix's start) went first


def test_a_prompt_follows_its_cached_prefix_and_its_prediction_counts_only_the_uncached_prefill():
    router = FleetRouter(rng=random.Random(0))
    loads = {"r1": _load(), "r2": _load()}
    system = _ids(7, 1024)
    first = _sent_and_answered(router, loads, system + _ids(8, 40))
    for turn in range(5):
        decision = router.choose(loads, system + _ids(100 + turn, 40))
        assert decision is not None and decision.ranked[0] == first
        best, other = decision.candidates
        assert best.cached_tokens == 1024 and other.cached_tokens == 0
        assert best.first_token_s == pytest.approx(0.2 + 40e-3)  # its wait, then only the 40 uncached tokens
        assert other.first_token_s == pytest.approx(0.2 + 1064e-3)
        router.answered(decision, first, 1024, 0.25)
        # Past its first token it still counts where it runs (its place in the batch) until it ends.
        again = router.choose(loads, system + _ids(100 + turn, 40))
        assert again is not None and again.candidates[0].first_token_s == pytest.approx(0.2 + 0.01 + 8e-3)
        router.ended(again)
        router.finished(decision)


def test_a_warm_replica_loses_the_request_once_its_queue_costs_more_than_the_prefill_it_saves():
    router = FleetRouter(rng=random.Random(0))
    system = _ids(7, 1024)
    warm = _sent_and_answered(router, {"r1": _load(), "r2": _load(wait_s=5.0)}, system)
    assert warm == "r1"
    cold = "r2"
    # Busy, but less than the 1 s of prefill the cache saves: still the warm one.
    decision = router.choose({warm: _load(wait_s=0.9), cold: _load(wait_s=0.2)}, system + _ids(9, 20))
    assert decision is not None and decision.ranked[0] == warm
    router.answered(decision, warm, 1024, 1.0)
    # Busier than that: the request spills over to the cold replica rather than piling onto the warm one.
    decision = router.choose({warm: _load(wait_s=2.5), cold: _load(wait_s=0.2)}, system + _ids(10, 20))
    assert decision is not None and decision.ranked == (cold, warm)


def test_a_burst_decided_between_two_reports_spreads_once_the_pending_work_outweighs_the_cache():
    router = FleetRouter(rng=random.Random(0))
    loads = {"r1": _load(rate=1e-3), "r2": _load(rate=1e-3)}
    system = _ids(7, 512)
    decisions = [router.choose(loads, system + _ids(i, 16)) for i in range(120)]  # no answer comes back meanwhile
    share = {r: sum(1 for d in decisions if d is not None and d.ranked[0] == r) for r in loads}
    # 10 ms per pending request against ~0.5 s of prefill saved: the warm replica takes the first ~50, then both.
    assert min(share.values()) >= 20, share


def test_near_best_replicas_are_offered_together_so_serve_s_live_probe_takes_the_less_loaded():
    router = FleetRouter(rng=random.Random(0))
    close = router.choose({"r1": _load(wait_s=1.00), "r2": _load(wait_s=1.05), "r3": _load(wait_s=3.0)}, _ids(1, 8))
    assert close is not None and close.ranks == ((close.ranked[0], close.ranked[1]), ("r3",))
    apart = router.choose({"r1": _load(wait_s=1.00), "r2": _load(wait_s=1.5)}, _ids(2, 8))
    assert apart is not None and apart.ranks == (("r1",), ("r2",))


def test_of_near_best_replicas_the_one_holding_the_prefix_goes_first_alone():
    """A second copy of a prefix would cost the fleet cache room (W1's prefixes fit two caches once each): within the
    near-tie slack the warm replica keeps it, past the slack the request spills over."""
    router = FleetRouter(rng=random.Random(0))
    system = _ids(7, 1024)
    warm = _sent_and_answered(router, {"r1": _load(), "r2": _load(wait_s=5.0)}, system)
    cold = "r2"
    # Cold: 0.2 s + 1,064 tokens of prefill = 1.264 s; warm: 1.26 s + 40 tokens = 1.30 s, within the slack.
    decision = router.choose({warm: _load(wait_s=1.26), cold: _load(wait_s=0.2)}, system + _ids(9, 40))
    assert decision is not None and decision.ranks == ((warm,), (cold,))
    assert decision.candidates[0].cached_tokens == 1024
    router.answered(decision, warm, 1024, 1.3)
    router.finished(decision)
    decision = router.choose({warm: _load(wait_s=1.6), cold: _load(wait_s=0.2)}, system + _ids(10, 40))
    assert decision is not None and decision.ranks == ((cold,), (warm,))


def test_identical_idle_replicas_share_unrelated_prompts_at_random():
    router = FleetRouter(rng=random.Random(3))
    loads = {f"r{i}": _load(in_system=0) for i in range(1, 5)}
    firsts = [_sent_and_answered(router, loads, _ids(i, 8)) for i in range(400)]  # under a block: nothing cached
    assert {firsts.count(r) for r in loads} and min(firsts.count(r) for r in loads) > 50


def test_two_ingress_replicas_put_a_new_prefix_on_the_same_replica_and_spread_different_prefixes():
    one, other = FleetRouter(rng=random.Random(1)), FleetRouter(rng=random.Random(2))
    loads = {"r1": _load(), "r2": _load()}
    placed = []
    for k in range(40):
        prompt = _ids(1000 + k, 300)
        a, b = one.choose(loads, prompt), other.choose(loads, prompt)
        assert a is not None and b is not None and a.ranked[0] == b.ranked[0]
        one.ended(a)
        other.ended(b)
        placed.append(a.ranked[0])
    assert min(placed.count("r1"), placed.count("r2")) >= 10


def test_a_request_refused_before_any_output_leaves_no_expected_blocks_behind():
    router = FleetRouter(rng=random.Random(0))
    loads = {"r1": _load(), "r2": _load(wait_s=3.0)}
    prompt = _ids(4, 300)
    first = router.choose(loads, prompt)
    second = router.choose(loads, prompt)  # sent while the first is prefilling: expected to find its blocks
    assert first is not None and second is not None and second.candidates[0].cached_tokens == 288
    router.ended(first)  # refused by its replica: the second still computes them
    third = router.choose(loads, prompt)
    assert third is not None and third.candidates[0].cached_tokens == 288
    router.ended(second)
    router.ended(third)  # none of them computed anything there
    again = router.choose(loads, prompt)
    assert again is not None and again.candidates[0].cached_tokens == 0


def test_a_missed_prediction_forgets_that_block_and_every_older_one_and_counts_against_precision():
    router = FleetRouter(rng=random.Random(0))
    loads = {"r1": _load(), "r2": _load(wait_s=3.0)}
    a, b, c = _ids(1, 256), _ids(2, 256), _ids(3, 256)
    for ids in (a, b, c):  # all onto r1 (r2 is busy), A the least recently used
        assert _sent_and_answered(router, loads, ids) == "r1"
    assert router.figures().replicas["r1"].precision is None  # nothing was predicted cached yet
    # r1's engine no longer holds B (evicted, or restarted): the estimate is told by B's answer.
    assert _sent_and_answered(router, loads, b, cached=0) == "r1"
    figures = router.figures().replicas["r1"]
    assert (figures.predicted_cached_tokens, figures.confirmed_cached_tokens, figures.precision) == (240, 0, 0.0)
    predicted = {name: router.choose(loads, ids).predicted_for("r1").cached_tokens  # type: ignore[union-attr]
                 for name, ids in (("c", c), ("b", b), ("a", a))}
    # B is held again (just computed), C (used after B) still is, A (used before B) cannot be any more; and the
    # estimate of r1's cache is cut to what LRU would have kept: about C and B.
    assert predicted == {"a": 0, "b": 240, "c": 240}
    assert router.figures().replicas["r1"].estimated_blocks <= 3 * 16


def test_a_confirmed_prediction_counts_as_precise():
    router = FleetRouter(rng=random.Random(0))
    loads = {"r1": _load(), "r2": _load(wait_s=3.0)}
    system = _ids(5, 300)
    _sent_and_answered(router, loads, system)
    _sent_and_answered(router, loads, system + _ids(6, 30))
    figures = router.figures().replicas["r1"]
    assert figures.precision == 1.0 and figures.realized_cached_tokens == 288 and figures.routed == 2


def test_no_replica_in_time_refuses_at_once_with_the_predicted_excess_but_an_idle_or_unmeasured_one_never_does():
    router = FleetRouter(rng=random.Random(0))
    busy = {"r1": _load(wait_s=14.0), "r2": _load(wait_s=16.0)}
    decision = router.choose(busy, _ids(1, 100), first_token_target_s=10.0)
    assert decision is not None and isinstance(decision.refusal, OverTimeTarget)
    assert decision.refusal.retry_after_s == 5 and "soonest of 2 replica(s)" in decision.refusal.message
    assert decision.refusal.prompt_tokens == 100  # counted against its tenant's refused tokens
    assert router.figures().replicas["r1"].routed == 0 and router.figures().refused == 1
    for loads in ({"r1": _load(wait_s=14.0, in_system=0)}, {"r1": _load(wait_s=None, rate=None, in_system=40)}):
        decision = router.choose(loads, _ids(1, 100), first_token_target_s=10.0)
        assert decision is not None and decision.refusal is None  # the replica itself decides


def test_a_continued_answer_goes_where_the_longest_prefix_of_prompt_and_output_is_held():
    router = FleetRouter(rng=random.Random(0))
    prompt, generated = _ids(1, 200), _ids(2, 100)
    loads = {"r1": _load(), "r2": _load(wait_s=0.4), "r3": _load(wait_s=0.4)}
    assert _sent_and_answered(router, loads, prompt) == "r1"
    # r2 once answered the same prompt and more of what r1 generated: it holds the longest prefix.
    _sent_and_answered(router, {"r2": _load()}, prompt + generated[:64] + [0])
    decision = router.choose(loads, prompt + generated, avoid=frozenset({"r1"}))  # r1 failed under it
    assert decision is not None and decision.ranked[0] == "r2" and "r1" not in decision.ranked
    assert decision.candidates[0].cached_tokens == 256


def test_a_salted_prompt_shares_blocks_only_with_the_same_salt_in_the_router_and_the_engine():
    prompt = _ids(1, 100)
    assert block_hashes(prompt, BLOCK, "tenant-a") != block_hashes(prompt, BLOCK, "tenant-b") != block_hashes(
        prompt, BLOCK)
    router = FleetRouter(rng=random.Random(0))
    loads = {"r1": _load(), "r2": _load(wait_s=0.21)}
    assert _sent_and_answered(router, loads, prompt) == "r1"  # r1 holds the unsalted prompt
    salted = router.choose(loads, prompt, salt="tenant-a")
    assert salted is not None and all(c.cached_tokens == 0 for c in salted.candidates)  # no hit predicted
    router.ended(salted)
    assert router.choose(loads, prompt).candidates[0].cached_tokens == 96  # type: ignore[union-attr]


async def test_the_fake_engine_s_prefix_cache_is_shared_only_under_the_same_salt():
    engine = FakeEngine(block_tokens=BLOCK)
    engine.start()
    prompt = _ids(1, 100)

    async def cached(salt: str | None) -> int | None:
        params = make_request("x", max_tokens=1, cache_salt=salt).params
        deltas = [d async for d in engine.generate(f"r-{salt}-{random.random()}", prompt, params)]
        return deltas[0].cached_tokens

    assert await cached(None) == 0
    assert await cached("tenant-a") == 0  # the unsalted blocks are not its
    assert await cached("tenant-a") == 96 and await cached(None) == 96 and await cached("tenant-b") == 0


def test_the_session_hint_counts_when_the_prompt_is_not_known_here_but_never_pins():
    router = FleetRouter(rng=random.Random(0))
    first = router.choose({"r1": _load(), "r2": _load(wait_s=0.3)}, None, session="chat-1")
    assert first is not None and first.ranked[0] == "r1"
    router.answered(first, "r1", 0, 0.2, prompt_tokens=1000)  # the replica said how long the prompt was
    warm_but_busier = {"r1": _load(wait_s=0.6), "r2": _load(wait_s=0.3)}
    assert router.choose(warm_but_busier, None).ranked[0] == "r2"  # type: ignore[union-attr]  # no hint: load
    hinted = router.choose(warm_but_busier, None, session="chat-1")
    assert hinted is not None and hinted.ranked[0] == "r1" and hinted.candidates[0].cached_tokens == 992
    router.ended(hinted)
    much_busier = {"r1": _load(wait_s=2.0), "r2": _load(wait_s=0.3)}
    assert router.choose(much_busier, None, session="chat-1").ranked[0] == "r2"  # type: ignore[union-attr]


async def test_on_a_fleet_of_fake_engines_shared_prefixes_land_where_they_are_cached_and_realize_their_hits():
    fleet = FakeFleet(replicas=2, engine={"prefill_s_per_token": 2e-4, "block_tokens": BLOCK})
    systems = [f"You are a careful assistant for topic {k}. " * 12 for k in range(4)]
    for turn in range(3):
        for system in systems:
            items = await fleet.answer(make_request([{"role": "system", "content": system},
                                                     {"role": "user", "content": f"question {turn}"}], max_tokens=2))
            assert isinstance(items[0], Admitted)
    by_system: dict[int, set[str]] = {}
    for (_, replica), k in zip(fleet.sent, [k for _ in range(3) for k in range(4)], strict=True):
        by_system.setdefault(k, set()).add(replica)
    assert all(len(replicas) == 1 for replicas in by_system.values()), by_system  # each system prompt stays put
    figures = fleet.routing.router.figures()
    assert sum(f.routed for f in figures.replicas.values()) == 12
    confirmed = sum(f.confirmed_cached_tokens for f in figures.replicas.values())
    predicted = sum(f.predicted_cached_tokens for f in figures.replicas.values())
    assert predicted > 0 and confirmed == predicted  # every predicted hit was realized by the engine


async def test_on_a_fleet_a_hot_prefix_spills_over_instead_of_melting_one_replica():
    fleet = FakeFleet(replicas=2, engine={"prefill_s_per_token": 1e-4, "block_tokens": BLOCK, "token_delay_s": 0.002},
                      deployment={"max_ongoing_requests": 64, "max_queued_requests": 64})
    system = [{"role": "system", "content": "Shared instructions. " * 40}]
    answers = await fleet.answer_all([make_request([*system, {"role": "user", "content": f"q{i}"}], max_tokens=8)
                                      for i in range(60)])
    assert all(isinstance(a[0], Admitted) for a in answers)
    assert min(fleet.share().values()) >= 10, fleet.share()  # both replicas serve the hot prefix


async def test_a_request_no_replica_can_serve_in_time_is_refused_at_the_ingress_without_a_call():
    fleet = FakeFleet(replicas=2)
    fleet.backend._loads = lambda: {"r1": _load(wait_s=30.0), "r2": _load(wait_s=31.0)}  # type: ignore[method-assign]
    with pytest.raises(OverTimeTarget) as refused:
        await fleet.answer(make_request("a question", max_tokens=4))
    # The model's 10 s target; 30 s predicted, and the prompt's 10 tokens' prefill: 21 s too late, and not sent.
    assert refused.value.retry_after_s == 21 and fleet.sent == []


async def test_a_prompt_rendered_at_the_ingress_is_the_prompt_the_engine_sees():
    fleet = FakeFleet(replicas=2, engine={"block_tokens": BLOCK})
    prompt = PromptInput(messages=({"role": "user", "content": "hello " * 30},),
                         tools=({"type": "function", "function": {"name": "lookup"}},))
    ids = await fleet.routing.prompt_ids(prompt)
    engine = FakeEngine()
    assert ids == engine.render_chat([dict(m) for m in prompt.messages or ()], [dict(t) for t in prompt.tools or ()])
    items = await fleet.answer(make_request(prompt, max_tokens=2, return_token_ids=True))
    assert next(i for i in items if isinstance(i, GenerationDelta)).prompt_token_ids == tuple(ids)


async def test_routing_shows_per_replica_in_stats_and_metrics():
    fleet = FakeFleet(replicas=2, engine={"block_tokens": BLOCK})

    async def every_replica():
        return {r: await h.stats() for r, h in fleet.hosts.items()}

    fleet.backend.replica_stats = every_replica  # type: ignore[method-assign]
    system = [{"role": "system", "content": "Shared instructions. " * 10}]
    for i in range(3):
        await fleet.answer(make_request([*system, {"role": "user", "content": f"q{i}"}], max_tokens=2))
    config = fleet.config
    app = create_app(config, {fleet.model.id: fleet.backend})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
        routing = (await client.get("/stats")).json()[fleet.model.id]["routing"]
        metrics = (await client.get("/metrics")).text
    replica = fleet.sent[0][1]
    assert routing["replicas"][replica]["routed"] == 3 and routing["replicas"][replica]["precision"] == 1.0
    assert routing["decision_p99_ms"] is not None and routing["refused_over_time_target"] == 0
    # The thread's CPU time cannot exceed the wall time it was measured in.
    assert 0 <= routing["decision_cpu_p99_ms"] <= routing["decision_p99_ms"] + 0.01
    assert f'app_routed_requests_total{{model_name="{fleet.model.id}",replica="{replica}"}} 3.0' in metrics
    assert "app_routing_decision_p99_seconds{" in metrics and "app_routing_decision_cpu_p99_seconds{" in metrics
