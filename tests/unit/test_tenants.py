"""Tenants: the config's `tenants:`, who a request's tenant is, and a replica's admission fair between tenants by the
tokens each has been served (app/host/fair_queue.py)."""

from __future__ import annotations

import asyncio
import random

import pytest

from app.api_keys import digest_of
from app.config.app_config import AppConfig, parse_config
from app.config.common import ConfigError
from app.config.tenants import TenantConfig
from app.engine.fake import FakeEngine
from app.engine.interface import PromptInput
from app.errors import OverTimeTarget, QueueFull, TenantOverShare, TenantRateLimited
from app.host.admission import Admission, Targets
from app.host.fair_queue import FairQueue
from app.host.ticket import Ticket
from app.http.tenant_limits import TenantLimits, prompt_token_bound
from app.tenancy import Tenant, Tenants, cache_salt, key_tenant_name
from tests.support.fake_stack import MAX_MODEL_LEN, MODEL_ID, chat_body, config_dict
from tests.support.waiting import until

MODEL = {"id": "m", "source": "fake"}
A, B, C = Tenant("a"), Tenant("b"), Tenant("c")


def config(**top) -> AppConfig:
    return parse_config({"models": [MODEL], **top})


# -- the config --------------------------------------------------------------


def test_tenants_are_declared_with_keys_weight_and_priority():
    c = config(tenants=[{"name": "team-a", "api_keys": ["ka"], "weight": 3},
                        {"name": "nightly", "api_keys": [digest_of("kb")], "priority": "batch"}])
    tenants = Tenants(c.with_resolved_keys())
    assert tenants.of(b"Bearer ka", "10.0.0.1") == Tenant("team-a", 3.0, False, own_cache=True)
    assert tenants.of(b"Bearer kb", "10.0.0.1") == Tenant("nightly", 1.0, True, own_cache=True)
    assert tenants.of(b"Bearer kc", "10.0.0.1") is None  # keys configured: no key of theirs is a 401
    assert tenants.of(b"", None) is None


@pytest.mark.parametrize("top, said", [
    ({"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": ["k"]}]},
     "tenants.1.api_keys.0: this key is already given at tenants.0.api_keys.0"),
    ({"tenants": [{"name": "a", "api_keys": ["k"]}, {"name": "b", "api_keys": [digest_of("k")]}]},
     "tenants.1.api_keys.0: this key is already given at tenants.0.api_keys.0"),  # the same key in either form
    ({"service": {"api_keys": ["k"]}, "tenants": [{"name": "a", "api_keys": ["k"]}]},
     "tenants.0.api_keys.0: this key is already given at service.api_keys.0"),
    ({"tenants": [{"name": "a", "api_keys": ["k1"]}, {"name": "a", "api_keys": ["k2"]}]},
     "tenants.1.name: 'a' is already given at tenants.0.name; tenant names must be unique"),
    ({"tenants": [{"name": "a", "api_keys": []}]}, "tenants.0.api_keys: give at least 1 item here"),
    ({"tenants": [{"name": "a b", "api_keys": ["k"]}]}, "tenants.0.name"),
    ({"tenants": [{"name": "a", "api_keys": ["k"], "weight": 0}]}, "tenants.0.weight"),
    ({"tenants": [{"name": "a", "api_keys": ["k"], "priority": "urgent"}]}, "tenants.0.priority"),
    ({"tenants": [{"name": "a", "api_keys": ["k"], "share": 2}]}, "tenants.0.share: unknown key"),
])
def test_a_wrong_tenants_list_is_refused_naming_the_key(top, said):
    with pytest.raises(ConfigError) as err:
        config(**top)
    assert said in str(err.value)


def test_each_service_key_is_a_tenant_of_its_own_and_without_keys_the_address_is(monkeypatch):
    monkeypatch.setenv("APP_API_KEYS", "from-env")
    keyed = Tenants(config(service={"api_keys": ["k1"]}).with_resolved_keys())
    one, env = keyed.of(b"Bearer k1", "h"), keyed.of(b"Bearer from-env", "h")
    assert one == Tenant(key_tenant_name(digest_of("k1").removeprefix("sha256:")))
    assert env is not None and env.name != one.name and "k1" not in one.name
    monkeypatch.delenv("APP_API_KEYS")
    open_ = Tenants(config())
    assert open_.of(b"", "10.0.0.7") == Tenant("addr:10.0.0.7")
    assert open_.of(b"", "10.0.0.7").metrics_label == "by-address"  # one label for every address


def test_an_environment_key_a_tenant_names_stays_that_tenant_s(monkeypatch):
    monkeypatch.setenv("APP_API_KEYS", "shared")
    resolved = config(tenants=[{"name": "t", "api_keys": ["shared"]}]).with_resolved_keys()
    assert resolved.service.api_keys == ()
    assert Tenants(resolved).of(b"Bearer shared", None) == Tenant("t", own_cache=True)


# -- the fair queue ----------------------------------------------------------


class Item:
    def __init__(self, tenant: Tenant, prompt_tokens: int = 10, tokens: int = 30):
        self.tenant, self.prompt_tokens, self.tokens = tenant, prompt_tokens, tokens
        self.paused = False


def test_the_least_served_waiting_tenant_goes_first_and_one_tenant_is_fifo():
    q: FairQueue[Item] = FairQueue()
    for t in (A, B):
        q.entered(t)
    q.charge(A, prompt_tokens=100)
    a1, a2, b1 = Item(A), Item(A), Item(B)
    for item in (a1, a2, b1):
        q.append(item)
    assert q.head() is b1 and list(q)[0] is b1
    q.charge(B, generated=100)  # b now served 200, a 100
    assert q.head() is a1
    assert q.pop_head() is a1 and q.pop_head() is a2 and q.pop_head() is b1 and not q


def test_a_tenant_arriving_starts_at_the_least_served_so_idle_time_earns_nothing():
    q: FairQueue[Item] = FairQueue()
    q.entered(A), q.arrived(A)
    q.started(A, prompt_tokens=1000)
    q.entered(B), q.arrived(B)
    assert q.counter(B) == q.counter(A) == 1000  # nobody waits: level with the tenant admitted last
    q.append(Item(B))
    q.charge(B, prompt_tokens=10)
    q.entered(C), q.arrived(C)
    assert q.counter(C) == 1010  # level with the least served of those waiting
    q.left(A)
    assert q.counter(A) == 1010  # not below the floor: it cannot come back with credit
    q.left(B), q.left(C)
    q.entered(A), q.arrived(A)
    assert q.counter(A) == 0  # the system emptied: the next contention starts even


def test_a_tenant_whose_requests_run_but_none_waits_earns_no_credit_against_a_backlogged_one():
    """VTC's rule, not "nothing in the system": A's long streams keep running while B, backlogged, is served; A's
    next request starts level with B instead of spending the credit it built meanwhile starving B."""
    q: FairQueue[Item] = FairQueue()
    q.entered(A), q.arrived(A)
    q.started(A, prompt_tokens=10)  # A's stream runs on and on
    b1, b2 = Item(B), Item(B)
    for item in (b1, b2):
        q.entered(B), q.arrived(B), q.append(item)
    q.charge(B, prompt_tokens=5000)  # B served meanwhile
    a2 = Item(A)
    q.entered(A), q.arrived(A), q.append(a2)
    assert q.counter(A) == q.counter(B) == 5010
    q.charge(A, generated=1)  # from here, the least served goes first
    assert q.head() is b1
    q.arrived(A)  # another of A's while A already waits: no lift
    assert q.counter(A) == 5012


def test_weights_divide_the_service_counted():
    q: FairQueue[Item] = FairQueue()
    heavy = Tenant("heavy", weight=4)
    q.entered(heavy), q.entered(A)
    q.charge(heavy, prompt_tokens=400)
    q.charge(A, prompt_tokens=100)
    assert q.counter(heavy) == q.counter(A) == 100


def test_batch_waits_behind_interactive_and_is_refused_first():
    q: FairQueue[Item] = FairQueue()
    nightly = Tenant("nightly", batch=True)
    for t in (A, nightly):
        q.entered(t)
    q.charge(A, prompt_tokens=10_000)
    batch, interactive = Item(nightly), Item(A)
    q.append(batch), q.append(interactive)
    assert q.head() is interactive
    assert q.over_share(Tenant("b")) is batch
    assert q.over_share(Tenant("other-batch", batch=True)) is None  # a batch newcomer never displaces better


def test_over_share_names_the_newest_of_the_tenant_holding_the_most_places():
    q: FairQueue[Item] = FairQueue()
    a1, a2, b1 = Item(A), Item(A), Item(B)
    for item in (a1, a2, b1):
        q.entered(item.tenant), q.append(item)
    assert q.over_share(A) is None  # A's own newcomer: first come, first served
    assert q.over_share(B) is None  # B would hold two places as A does: an even split stands
    assert q.over_share(C) is a2  # C holds none: A's newest gives way
    q.remove(a2), q.left(A)
    assert q.over_share(C) is None  # one place each: even
    heavy = Tenant("heavy", weight=3)
    assert q.over_share(heavy) is not None  # by weight: a third of a place against one
    for _ in range(3):
        q.entered(heavy)
    assert q.over_share(heavy) is None  # four places at weight 3 are more than one at weight 1


# -- admission over tenants ----------------------------------------------------


def admission(max_running=1, max_queued=2) -> Admission:
    return Admission(max_running=max_running, max_queued=max_queued, token_budget=10_000, queue_timeout_s=30)


async def test_a_tenant_with_a_backlog_shares_the_replica_with_one_that_arrives_later():
    adm = admission(max_running=1, max_queued=20)
    running = adm.reserve(A)
    await running.admit(30, 5, prompt_tokens=10, max_steps=20)
    order: list[str] = []
    tickets: dict[Ticket, asyncio.Task] = {}

    def wait(tenant: Tenant) -> None:
        ticket = adm.reserve(tenant)

        async def run() -> None:
            await ticket.admit(30, 30, prompt_tokens=10, max_steps=20)
            order.append(tenant.name)
        tickets[ticket] = asyncio.create_task(run())

    for _ in range(6):
        wait(A)
    for _ in range(3):
        wait(B)
    await until(lambda: adm.stats().waiting == 9, what="nine waiting")
    current = running
    while tickets or current is not None:
        current.produced(20)
        current.release(completed=True)
        current = next((t for t in tickets if t.state == "running"), None)
        if current is not None:
            await tickets.pop(current)
    # B, arriving behind six of A's, is served every other turn: not after all of them.
    assert order[:6] == ["b", "a", "b", "a", "b", "a"], order
    assert adm.stats().in_system == 0


async def a_backlog(adm: Admission, waiting: int, max_steps: int, produced: int
                    ) -> tuple[Ticket, list[Ticket], list[asyncio.Task]]:
    """One of A's running (having produced `produced` tokens) and `waiting` more of A's in the queue, each of 10
    prompt tokens and `max_steps` at most."""
    running = adm.reserve(A)
    await running.admit(10 + max_steps, 300, prompt_tokens=10, max_steps=max_steps)
    running.produced(produced)
    queued = [adm.reserve(A) for _ in range(waiting)]
    tasks = [asyncio.create_task(t.admit(10 + max_steps, 300, prompt_tokens=10, max_steps=max_steps))
             for t in queued]
    await until(lambda: adm.stats().waiting == waiting, what=f"{waiting} of A's waiting")
    return running, queued, tasks


async def test_full_a_less_served_tenant_takes_the_place_of_the_most_served_one_s_newest():
    adm = admission(max_running=1, max_queued=2)
    hog, queued, tasks = await a_backlog(adm, waiting=2, max_steps=20, produced=20)
    with pytest.raises(QueueFull) as full:
        adm.reserve(A)  # A itself, full: refused as ever
    assert not isinstance(full.value, TenantOverShare)
    light = adm.reserve(B)  # B has had nothing: A's newest waiting request gives way
    with pytest.raises(TenantOverShare) as err:
        await tasks[1]
    assert err.value.status == 429 and err.value.code == "tenant_over_share" and err.value.retry_after_s
    queued[1].release()  # its handler's finally: gives back nothing more
    assert adm.stats().in_system == 3
    light_task = asyncio.create_task(light.admit(30, 30, prompt_tokens=10, max_steps=20))
    await until(lambda: adm.stats().waiting == 2, what="B waiting")
    hog.release(completed=True)
    await light_task  # B first: it is less served than A
    assert not tasks[0].done()
    light.release(), await asyncio.sleep(0)
    await tasks[0]
    queued[0].release()
    assert adm.stats().in_system == 0 and adm.stats().running == 0


async def test_with_one_tenant_the_queue_is_first_come_first_served_as_before():
    adm = admission(max_running=2, max_queued=30)
    rng = random.Random(3)
    tickets = [adm.reserve(A) for _ in range(32)]
    sizes = [rng.randint(2, 40) for _ in tickets]  # one choice each, prompts of every size
    tasks = [asyncio.create_task(t.admit(size, 30, prompt_tokens=size - 1, max_steps=1))
             for t, size in zip(tickets, sizes, strict=True)]
    await until(lambda: adm.stats().waiting == 30, what="thirty waiting")
    started = []
    for _ in range(32):
        ticket = next(t for t in tickets if t.state == "running" and t not in started)
        started.append(ticket)
        ticket.release()
        await asyncio.sleep(0)
    await asyncio.gather(*tasks)
    assert started == tickets


# -- at the front door ---------------------------------------------------------


def tenant_stack(make_stack, token_delay_s: float = 0.0):
    data = config_dict(deployment={"max_ongoing_requests": 1, "max_queued_requests": 2, "queue_timeout_s": 30})
    data["tenants"] = [{"name": "heavy", "api_keys": ["k-heavy"]}, {"name": "light", "api_keys": ["k-light"]}]
    stack = make_stack(parse_config(data), FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=token_delay_s))
    seen: list[Tenant] = []
    generate = stack.host.generate

    def spying(request, client=None):
        seen.append(request.tenant)
        return generate(request, client)
    stack.host.generate = spying
    return stack, seen


def key(name: str) -> dict[str, str]:
    return {"Authorization": f"Bearer k-{name}"}


async def test_the_tenant_of_the_key_reaches_the_replica_and_an_unknown_key_is_a_401(make_stack):
    stack, seen = tenant_stack(make_stack)
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=key("light"))
    assert r.status_code == 200, r.text
    assert seen == [Tenant("light", own_cache=True)]
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=key("other"))
    assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error", r.text


async def test_a_tenant_s_cached_prompts_are_its_own_unless_it_shares_them(make_stack):
    data = config_dict()
    data["service"] = {"enable_prompt_tokens_details": True}
    data["tenants"] = [{"name": n, "api_keys": [f"k-{n}"], "share_prefix_cache": n.startswith("open")}
                       for n in ("heavy", "light", "open-1", "open-2")]
    stack = make_stack(parse_config(data))

    async def cached(name: str, **extra) -> int:
        body = chat_body("The same long system prompt, many blocks of it. " * 4, max_tokens=2, **extra)
        r = await stack.client.post("/v1/chat/completions", json=body, headers=key(name))
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    assert await cached("light") == 0
    assert await cached("light") > 0  # its own repeat hits
    assert await cached("heavy") == 0  # another tenant's timing tells it nothing of light's prompt
    light_s = cache_salt(Tenant("light", own_cache=True), None)
    for name in ("heavy", "open-1"):  # nor can anyone send light's salt, or one that leads to it
        for salt in (light_s, f"{light_s}/x"):
            r = await stack.client.post("/v1/chat/completions", json=chat_body(cache_salt=salt), headers=key(name))
            assert r.status_code == 400 and r.json()["error"]["param"] == "cache_salt", r.text
    assert await cached("heavy", cache_salt="s") == 0 and await cached("heavy", cache_salt="s") > 0
    assert await cached("open-1") == 0 and await cached("open-2") > 0  # those sharing share


async def test_a_tenant_filling_the_service_cannot_lock_another_out(make_stack):
    """One slot and two queue places, all taken by `heavy`: `light` is still let in at the front door (it holds
    less than an even share), takes the place of heavy's newest waiting request, and is answered before heavy's
    other waiting one; heavy's displaced request gets `429 tenant_over_share`."""
    stack, _ = tenant_stack(make_stack, token_delay_s=0.05)
    c = stack.client
    heavy = [asyncio.create_task(c.post("/v1/chat/completions", json=chat_body(f"h{i}", max_tokens=8),
                                        headers=key("heavy"))) for i in range(3)]
    await until(lambda: stack.host.admission.stats().in_system == 3, what="heavy holding every place")
    stats = (await c.get("/stats", headers=key("light"))).json()[MODEL_ID]
    assert stats["tenants_in_flight"] == {"heavy": 3}

    async def heavy_account() -> dict | None:
        account = (await c.get("/stats/tenants", headers=key("light"))).json()["heavy"]
        return account if account["queued"] == 2 else None
    account = await until(heavy_account, what="heavy's first in the engine, two waiting")
    assert account["in_flight"] == 3  # one slot, two waiting
    refused = await c.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=key("heavy"))
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "queue_full", refused.text
    light = await c.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=key("light"))
    assert light.status_code == 200, light.text
    answers = await asyncio.gather(*heavy)
    codes = sorted(r.json()["error"]["code"] if r.status_code != 200 else "ok" for r in answers)
    assert codes == ["ok", "ok", "tenant_over_share"], [r.text for r in answers]
    over = next(r for r in answers if r.status_code == 429)
    assert int(over.headers["retry-after"]) >= 1
    assert stack.host.admission.stats().in_system == 0
    metrics = (await c.get("/metrics")).text
    assert 'app_tenant_requests_total{status="429",tenant="heavy"} 2.0' in metrics
    assert 'app_tenant_requests_total{status="200",tenant="light"}' in metrics  # its chat and the polls above
    accounts = (await c.get("/stats/tenants", headers=key("light"))).json()
    usage = light.json()["usage"]
    assert accounts["light"] == {"in_flight": 0, "queued": 0, "prompt_tokens": usage["prompt_tokens"],
                                 "generated_tokens": usage["completion_tokens"], "reserved_tokens": 0, "refused": {},
                                 "refused_tokens": 0}
    assert accounts["heavy"]["refused"] == {"queue_full": 1, "tenant_over_share": 1}
    # The displaced request asked for 8 tokens after a prompt as long as each of the two served (it was tokenized
    # before it queued); the queue_full one was refused before its body was read.
    assert accounts["heavy"]["generated_tokens"] == 16 and accounts["heavy"]["in_flight"] == 0
    prompt = accounts["heavy"]["prompt_tokens"] // 2
    assert prompt > 0 and accounts["heavy"]["refused_tokens"] == 8 + prompt
    metrics = (await c.get("/metrics")).text
    assert f'app_tenant_tokens_total{{kind="generated",tenant="light"}} {usage["completion_tokens"]}.0' in metrics
    assert 'app_tenant_refusals_total{reason="tenant_over_share",tenant="heavy"} 1.0' in metrics
    assert f'app_tenant_refused_tokens_total{{tenant="heavy"}} {8 + prompt}.0' in metrics
    assert 'app_tenant_refused_tokens_total{tenant="light"}' not in metrics  # never refused
    assert 'app_tenant_requests_queued{tenant="heavy"} 0.0' in metrics


# -- limits at the front door (app/http/tenant_limits.py) ------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def limits(clock: Clock, **limit) -> TenantLimits:
    return TenantLimits([TenantConfig(name="a", api_keys=("k",), **limit)], clock=clock)


def test_requests_per_minute_slide_and_say_when_there_is_room():
    clock = Clock()
    lim = limits(clock, requests_per_minute=3)
    for _ in range(2):
        lim.admit_request(A)
        lim.done(A)
    clock.now += 20
    lim.admit_request(A)
    with pytest.raises(TenantRateLimited) as err:
        lim.admit_request(A)
    assert err.value.code == "tenant_rate_limited" and err.value.retry_after_s == pytest.approx(40)
    clock.now += 40.5  # the first two are out of the window
    lim.admit_request(A)
    lim.admit_request(B)  # a tenant without limits is not counted


def test_max_concurrent_counts_requests_in_flight():
    lim = limits(Clock(), max_concurrent=2)
    lim.admit_request(A), lim.admit_request(A)
    with pytest.raises(TenantRateLimited):
        lim.admit_request(A)
    lim.done(A)
    lim.admit_request(A)


def test_tokens_are_reserved_for_the_most_and_settled_to_the_use():
    clock = Clock()
    lim = limits(clock, tokens_per_minute=100)
    first = lim.reserve_tokens(A, 60)
    with pytest.raises(TenantRateLimited) as err:
        lim.reserve_tokens(A, 60)  # 120 would pass 100, even though the first has used nothing yet
    assert err.value.retry_after_s == pytest.approx(60)
    assert first is not None and lim.reserved() == {"a": 60}
    first.settle(10)  # it used 10: the rest is given back at once
    first.settle(10)  # (a second settle changes nothing)
    assert lim.reserved() == {"a": 0}
    second = lim.reserve_tokens(A, 60)
    with pytest.raises(TenantRateLimited) as never:
        lim.reserve_tokens(A, 101)  # more than the whole budget: waiting does not help
    assert never.value.retry_after_s is None and never.value.param == "max_tokens"
    with pytest.raises(TenantRateLimited):
        lim.reserve_each(A, [PromptInput(token_ids=(1,) * 20), PromptInput(token_ids=(1,) * 40)])  # all or none
    assert lim.reserve_tokens(A, 30) is not None and second is not None


def test_a_budget_held_by_requests_in_flight_says_to_retry_when_they_usually_end():
    """Reservations are for the most a request can cost; most use a fraction. Refused only for what requests in flight
    hold and will give back, a client is told to retry when they usually end, not when the minute has passed."""
    clock = Clock()
    lim = limits(clock, tokens_per_minute=100)
    done = lim.reserve_tokens(A, 40)
    clock.now += 3
    assert done is not None
    done.settle(10)  # held 3 s, used a quarter
    held = [lim.reserve_tokens(A, 40), lim.reserve_tokens(A, 40)]  # 10 + 80 of 100
    with pytest.raises(TenantRateLimited) as err:
        lim.reserve_tokens(A, 40)  # 30 over; the two in flight should give back about 60
    assert err.value.retry_after_s == pytest.approx(3)
    with pytest.raises(TenantRateLimited):  # all or none: the one made is given back, and teaches nothing
        lim.reserve_each(A, [PromptInput(token_ids=(1,) * 5), PromptInput(token_ids=(1,) * 40)])
    assert lim.reserved() == {"a": 80}
    with pytest.raises(TenantRateLimited) as err:
        lim.reserve_tokens(A, 40)
    assert err.value.retry_after_s == pytest.approx(3)
    with pytest.raises(TenantRateLimited) as err:
        lim.reserve_tokens(A, 90)  # 80 over: more than they would give back, so the window's own wait
    assert err.value.retry_after_s == pytest.approx(60)  # the two in flight leave the window a minute after now
    assert all(h is not None for h in held)


def test_prompt_token_bound_is_never_below_the_tokens():
    text = "héllo wörld 👋 " * 20
    assert prompt_token_bound(PromptInput(text=text)) == len(text.encode())
    assert prompt_token_bound(PromptInput(token_ids=(1, 2, 3))) == 3
    messages = ({"role": "user", "content": text},)
    assert prompt_token_bound(PromptInput(messages=messages)) > len(text.encode())


async def test_a_concurrent_burst_never_overruns_a_token_budget(make_stack):
    """64 requests at once against a budget a dozen fit in: the tokens the served ones used (as their usage says) are
    within the budget, the rest are refused with 429 tenant_rate_limited before any work, and once the served ones
    have settled to their use, the room they did not use is there again."""
    budget = 1000
    data = config_dict(deployment={"max_ongoing_requests": 4, "max_queued_requests": 64})
    data["tenants"] = [{"name": "metered", "api_keys": ["k-metered"], "tokens_per_minute": budget}]
    stack = make_stack(parse_config(data), FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.01))
    answers = await asyncio.gather(*(stack.client.post(
        "/v1/chat/completions", json=chat_body(f"q{i}", max_tokens=16), headers=key("metered")) for i in range(64)))
    served = [r.json()["usage"]["total_tokens"] for r in answers if r.status_code == 200]
    refused = [r.json()["error"]["code"] for r in answers if r.status_code != 200]
    assert served and refused and set(refused) == {"tenant_rate_limited"}
    assert sum(served) <= budget
    assert all(r.headers.get("retry-after") for r in answers if r.status_code == 429)
    again = await stack.client.post("/v1/chat/completions", json=chat_body("more", max_tokens=16),
                                    headers=key("metered"))
    assert again.status_code == 200, again.text  # the unused reservations came back
    account = (await stack.client.get("/stats/tenants", headers=key("metered"))).json()["metered"]
    assert account["prompt_tokens"] + account["generated_tokens"] == sum(served) + again.json()["usage"]["total_tokens"]
    assert account["reserved_tokens"] == 0 and account["refused"] == {"tenant_rate_limited": len(refused)}


async def test_a_body_declared_too_large_does_not_hold_one_of_its_tenants_concurrent_requests(make_stack):
    """`max_concurrent: 1`: a request refused 413 for its declared length before its body is read leaves the
    tenant's one place free for the next."""
    data = config_dict()
    data["service"] = {"max_body_bytes": 4096}
    data["tenants"] = [{"name": "one", "api_keys": ["k-one"], "max_concurrent": 1}]
    stack = make_stack(parse_config(data), FakeEngine(max_model_len=MAX_MODEL_LEN))
    body = b"{" + b" " * 8000 + b"}"
    too_large = await stack.client.post("/v1/chat/completions", content=body,
                                        headers={**key("one"), "Content-Type": "application/json"})
    assert too_large.status_code == 413, too_large.text
    r = await stack.client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers=key("one"))
    assert r.status_code == 200, r.text


def test_a_newcomer_waits_only_behind_what_goes_before_it():
    q: FairQueue[Item] = FairQueue()
    q.entered(A)
    q.charge(A, prompt_tokens=500)
    hog = [Item(A) for _ in range(5)]
    for item in hog:
        q.append(item)
    q.entered(B)
    assert q.ahead_of(A) == hog  # A's own newcomer: behind all of A's
    assert len(q.ahead_of(B)) <= 1  # B: at most behind A's first (they tie), not all five
    q.charge(A, prompt_tokens=10)
    assert q.ahead_of(B) == []


async def test_admission_by_time_predicts_a_light_tenant_behind_its_turn_not_behind_the_whole_queue():
    """Six of A's wait behind one running, each predicted 10 s: A's next is late for a 30 s target, B's newcomer
    (which goes next) is not."""
    from tests.unit.test_admission_by_time import _paced

    adm = Admission(max_running=1, max_queued=10, token_budget=100_000, queue_timeout_s=300, pace=_paced())
    running, queued, tasks = await a_backlog(adm, waiting=6, max_steps=100, produced=1)
    late = adm.reserve(A)
    with pytest.raises(OverTimeTarget):
        await late.admit(20, 300, Targets(first_token_s=30.0), prompt_tokens=10, max_steps=10)
    late.release()
    light = adm.reserve(B)
    light_task = asyncio.create_task(light.admit(20, 300, Targets(first_token_s=30.0), prompt_tokens=10,
                                                 max_steps=10))
    await until(lambda: adm.stats().waiting == 7, what="B waiting, not refused")
    running.release()
    await light_task
    assert light.state == "running" and all(t.state == "waiting" for t in queued)
    for t in [light, *queued]:
        t.release()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


async def test_a_waiting_request_made_late_by_another_tenant_going_first_is_refused_then():
    """One of A's runs (9.9 s left) and two wait, predicted at 10 s and 20 s against a 25 s target. B arrives and the
    fair order puts it first: A's second would now start at 30 s, past its target, and is refused at once with
    `over_time_target`, instead of being served late; A's first still makes it and keeps its place."""
    from tests.unit.test_admission_by_time import _paced

    adm = Admission(max_running=1, max_queued=10, token_budget=100_000, queue_timeout_s=300, pace=_paced())
    running = adm.reserve(A)
    await running.admit(110, 300, prompt_tokens=10, max_steps=100)
    running.produced(1)
    queued = [adm.reserve(A) for _ in range(2)]
    tasks = [asyncio.create_task(t.admit(110, 300, Targets(first_token_s=25.0), prompt_tokens=10, max_steps=100))
             for t in queued]
    await until(lambda: adm.stats().waiting == 2, what="two of A's waiting, in time")
    light = adm.reserve(B)
    light_task = asyncio.create_task(light.admit(110, 300, Targets(first_token_s=25.0), prompt_tokens=10,
                                                 max_steps=100))
    await until(lambda: tasks[1].done(), what="A's second refused when B went first")
    with pytest.raises(OverTimeTarget) as late:
        tasks[1].result()
    assert late.value.code == "over_time_target" and late.value.retry_after_s >= 1
    queued[1].release()
    assert adm.stats().waiting == 2 and not tasks[0].done()  # A's first and B's wait
    running.release()
    await light_task
    assert light.state == "running" and queued[0].state == "waiting"
    for t in (light, queued[0]):
        t.release()
    await tasks[0]


def test_a_refused_tenant_stays_backlogged_while_it_has_anything_in_the_system():
    """Refusals by time keep a tenant out of the queue; lifting it at each arrival would take from it the service it
    was refused (s4 in docs/tenants.md: the other tenant then had 65 % of the service)."""
    q: FairQueue[Item] = FairQueue()
    q.entered(A), q.arrived(A)
    q.started(A, prompt_tokens=10)  # A's long stream runs on
    q.entered(B), q.arrived(B), q.append(Item(B))
    q.refused(A)  # A becomes backlogged: lifted once, level with B
    assert q.counter(A) == q.counter(B) == 10
    q.charge(B, prompt_tokens=1000)
    q.entered(A), q.arrived(A)  # admitted at last, while B waits served more
    assert q.counter(A) == 10
    q.append(Item(A))
    assert q.pop_head().tenant is A
    q.started(A, prompt_tokens=10)
    q.arrived(A)  # nothing of A's waits, but its requests run: still backlogged
    assert q.counter(A) == 20
    q.left(A), q.left(A), q.left(A)  # A leaves the system
    q.entered(A), q.arrived(A)  # and comes back: lifted
    assert q.counter(A) == q.counter(B) == 1010
