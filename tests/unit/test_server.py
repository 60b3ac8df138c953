"""EngineHost around a FakeEngine: admission, the length contract, aborts, timeouts, a dying engine."""

from __future__ import annotations

import asyncio
import re

import pytest

from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.engine.fake_model import ANSWER
from app.engine.interface import Admitted, GenerationDelta, PromptInput
from app.errors import (
    ContextLengthExceeded,
    InvalidRequest,
    QueueFull,
    QueueFullUnavailable,
    RequestTimeout,
    ServiceUnavailable,
)
from app.host.engine_host import EngineHost
from tests.support.fake_stack import DEFAULT_MAX_TOKENS, MAX_MODEL_LEN, make_config, make_request


async def collect(host: EngineHost, request) -> tuple[Admitted, list[GenerationDelta]]:
    items = [item async for item in host.generate(request)]
    assert isinstance(items[0], Admitted)
    assert all(isinstance(i, GenerationDelta) for i in items[1:])
    return items[0], items[1:]


def text_of(deltas: list[GenerationDelta], index: int = 0) -> str:
    return "".join(c.text for d in deltas for c in d.choices if c.index == index)


def finish_of(deltas: list[GenerationDelta], index: int = 0) -> str | None:
    return [c.finish_reason for d in deltas for c in d.choices if c.index == index][-1]


def assert_idle(host: EngineHost) -> None:
    stats = host.admission.stats()
    assert (stats.in_system, stats.running, stats.waiting, stats.tokens_in_use) == (0, 0, 0, 0)
    assert host.engine.running == set()


async def test_first_item_is_admitted_with_prompt_tokens(host):
    admitted, deltas = await collect(host, make_request("hello"))
    assert admitted == Admitted(prompt_tokens=5, prompt_text=None)
    assert text_of(deltas) == ANSWER
    assert finish_of(deltas) == "stop"
    assert_idle(host)


async def test_chat_prompt_is_rendered(host, engine):
    messages = [{"role": "user", "content": "hi"}]
    admitted, _ = await collect(host, make_request(messages))
    assert admitted.prompt_tokens == len(engine.render_chat(messages))


async def test_token_id_prompt_with_prompt_text(host):
    ids = list("héllo".encode())
    admitted, _ = await collect(host, make_request(PromptInput(token_ids=tuple(ids)), want_prompt_text=True))
    assert admitted == Admitted(prompt_tokens=len(ids), prompt_text="héllo")


async def test_max_tokens_caps_output(host):
    _, deltas = await collect(host, make_request("x", max_tokens=3))
    assert sum(c.num_tokens for d in deltas for c in d.choices) == 3
    assert finish_of(deltas) == "length"


async def test_n_choices(host):
    _, deltas = await collect(host, make_request("x", n=3, temperature=1.0))
    assert {c.index for d in deltas for c in d.choices} == {0, 1, 2}
    assert all(finish_of(deltas, i) == "stop" for i in range(3))


async def test_context_length_message(host):
    prompt = "x" * 200
    with pytest.raises(ContextLengthExceeded) as info:
        await anext(host.generate(make_request([{"role": "user", "content": prompt}], max_tokens=100)))
    err = info.value
    prompt_tokens = len(host.engine.render_chat([{"role": "user", "content": prompt}]))
    assert err.param == "messages"
    assert err.code == "context_length_exceeded"
    assert str(err).startswith(
        f"This model's maximum context length is {MAX_MODEL_LEN} tokens. However, you requested "
        f"{prompt_tokens + 100} tokens ({prompt_tokens} in the messages, 100 in the completion)."
    )
    assert_idle(host)


async def test_context_length_for_text_prompt_names_prompt(host):
    with pytest.raises(ContextLengthExceeded) as info:
        await anext(host.generate(make_request("y" * 200, max_tokens=100)))
    assert info.value.param == "prompt"
    assert "(200 in the prompt, 100 in the completion)" in str(info.value)


async def test_prompt_over_max_prompt_tokens(host):
    with pytest.raises(ContextLengthExceeded) as info:
        await anext(host.generate(make_request("z" * MAX_MODEL_LEN, max_tokens=1, max_tokens_is_default=True)))
    assert info.value.param == "prompt"
    assert re.search(rf"at most {MAX_MODEL_LEN - 1} prompt tokens", str(info.value))
    assert_idle(host)


async def test_default_max_tokens_shrinks_to_fit(host):
    prompt_tokens = MAX_MODEL_LEN - 10
    request = make_request("p" * prompt_tokens, max_tokens=DEFAULT_MAX_TOKENS, max_tokens_is_default=True,
                           ignore_eos=True)
    admitted, deltas = await collect(host, request)
    assert admitted.prompt_tokens == prompt_tokens
    assert sum(c.num_tokens for d in deltas for c in d.choices) == 10  # what was left of the context
    assert finish_of(deltas) == "length"


async def test_empty_prompt_rejected(host):
    with pytest.raises(InvalidRequest) as info:
        await anext(host.generate(make_request("")))
    assert info.value.param == "prompt"
    assert_idle(host)


async def test_closing_early_aborts_engine_request():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.01)
    host = EngineHost(make_config().models[0], engine, ServiceConfig())
    request = make_request("hello", max_tokens=50, ignore_eos=True)
    gen = host.generate(request)
    assert isinstance(await anext(gen), Admitted)
    assert isinstance(await anext(gen), GenerationDelta)
    assert engine.running == {request.request_id}
    assert host.admission.stats().in_system == 1
    await gen.aclose()
    assert request.request_id in engine.aborted
    assert_idle(host)


async def test_finished_request_is_not_aborted(host, engine):
    request = make_request("hello")
    await collect(host, request)
    assert request.request_id not in engine.aborted


async def test_deadline_passed_is_request_timeout(host, engine):
    request = make_request("hello", timeout_s=-1)
    with pytest.raises(RequestTimeout) as info:
        await anext(host.generate(request))
    assert info.value.status == 504
    assert request.request_id in engine.aborted
    assert_idle(host)


async def test_deadline_mid_stream_is_request_timeout():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.02)
    host = EngineHost(make_config().models[0], engine, ServiceConfig())
    request = make_request("hello", timeout_s=0.3, max_tokens=100, ignore_eos=True)
    seen = []
    with pytest.raises(RequestTimeout):
        async for item in host.generate(request):
            seen.append(item)
    assert isinstance(seen[0], Admitted) and len(seen) > 1
    assert request.request_id in engine.aborted
    assert_idle(host)


async def test_dead_engine_is_service_unavailable(host, engine):
    await host.check_health()
    engine.kill()
    with pytest.raises(ServiceUnavailable) as info:
        await anext(host.generate(make_request("hello")))
    assert info.value.status == 503 and info.value.retry_after_s
    with pytest.raises(RuntimeError, match="dead"):
        await host.check_health()
    with pytest.raises(ServiceUnavailable):  # refused up front from now on
        await anext(host.generate(make_request("hello")))
    assert (await host.stats()).healthy is False
    assert_idle(host)


async def test_engine_dying_mid_stream():
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.01)
    host = EngineHost(make_config().models[0], engine, ServiceConfig())
    gen = host.generate(make_request("hello", max_tokens=50, ignore_eos=True))
    assert isinstance(await anext(gen), Admitted)
    await anext(gen)
    engine.kill()
    with pytest.raises(ServiceUnavailable):
        async for _ in gen:
            pass
    with pytest.raises(RuntimeError, match="died mid-request"):
        await host.check_health()
    assert_idle(host)


async def test_check_health_detects_dead_engine(host, engine):
    engine.kill()
    with pytest.raises(Exception, match="dead"):
        await host.check_health()


async def test_invalid_json_schema_raised_before_admitted(host):
    request = make_request("hello", json_schema={"type": 12})
    gen = host.generate(request)
    with pytest.raises(InvalidRequest) as info:
        await anext(gen)  # the very first item: no Admitted went out
    assert info.value.param == "response_format"
    assert info.value.status == 400
    assert_idle(host)


async def test_valid_json_schema_generates_json(host):
    _, deltas = await collect(host, make_request("hello", json_schema={"type": "object"}))
    assert text_of(deltas) == '{"fake": true}'


async def test_queue_full_refused_before_work():
    cfg = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 0})
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.01)
    host = EngineHost(cfg.models[0], engine, ServiceConfig())
    first = host.generate(make_request("a", max_tokens=50, ignore_eos=True))
    await anext(first)
    with pytest.raises(QueueFull) as info:
        await anext(host.generate(make_request("b")))
    assert info.value.status == 429 and info.value.retry_after_s >= 1
    await first.aclose()
    assert_idle(host)
    host503 = EngineHost(cfg.models[0], FakeEngine(token_delay_s=0.01), ServiceConfig(refusal_status=503))
    held = host503.generate(make_request("a", max_tokens=50, ignore_eos=True))
    await anext(held)
    with pytest.raises(QueueFullUnavailable):
        await anext(host503.generate(make_request("b")))
    await held.aclose()


async def test_requests_queue_and_all_finish():
    cfg = make_config(deployment={"max_ongoing_requests": 1, "max_queued_requests": 4})
    engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=0.001)
    host = EngineHost(cfg.models[0], engine, ServiceConfig())
    results = await asyncio.gather(*(collect(host, make_request(f"q{i}")) for i in range(4)))
    assert all(text_of(deltas) == ANSWER for _, deltas in results)
    assert host.admission.stats().peak_waiting >= 1
    assert_idle(host)


async def test_drain_refuses_new_requests(host):
    host.close_admission()
    with pytest.raises(ServiceUnavailable):
        await anext(host.generate(make_request("hello")))


async def test_tokenize_detokenize_and_stats(host, engine):
    ids = await host.tokenize(PromptInput(text="héllo"))
    assert ids == list("héllo".encode())
    assert await host.detokenize(ids) == "héllo"
    with pytest.raises(InvalidRequest):
        await host.tokenize(PromptInput(text=""))
    stats = await host.stats()
    assert stats.model == "fake-model" and stats.healthy is True
    assert stats.admission.in_system == 0
    assert stats.kv_cache_tokens == engine.kv_cache_tokens


async def test_token_budget_defaults_to_kv_cache():
    host = EngineHost(make_config().models[0], FakeEngine(kv_cache_tokens=1234), ServiceConfig())
    assert host.admission.token_budget == 1234
    host = EngineHost(make_config(deployment={"token_budget": 99}).models[0], FakeEngine(), ServiceConfig())
    assert host.admission.token_budget == 99


class DeadOnceEngine(FakeEngine):
    """Raises EngineDead from generate, while its own check_health still passes: the host must remember."""

    async def generate(self, request_id, prompt_token_ids, params):
        from app.engine.interface import EngineDead

        raise EngineDead("lost the worker process")
        yield  # pragma: no cover


async def test_host_remembers_a_dead_engine():
    engine = DeadOnceEngine(max_model_len=MAX_MODEL_LEN)
    host = EngineHost(make_config().models[0], engine, ServiceConfig())
    await engine.check_health()
    with pytest.raises(ServiceUnavailable):
        await anext(host.generate(make_request("hello")))
    await engine.check_health()  # the engine itself claims to be fine ...
    with pytest.raises(Exception, match="lost the worker process"):
        await host.check_health()  # ... but the replica must be replaced
    assert_idle(host)
