"""An engine that ends a request unfinished (`EngineFailed`: vLLM's finish reason `abort` or `error`)
while it stays usable: the host turns it into a 503 ServiceUnavailable, the HTTP API into a 503 body
or, once a stream has started, an error event then `[DONE]`; never a silent "stop". The engine is not
declared dead (one failed request must not get the replica replaced) and nothing leaks."""

from __future__ import annotations

from contextlib import aclosing

import pytest

from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.engine.interface import Admitted, EngineFailed, GenerationDelta
from app.errors import ServiceUnavailable
from app.host.engine_host import EngineHost
from tests.support import sse
from tests.support.error_shape import assert_error_shape
from tests.support.fake_stack import MAX_MODEL_LEN, chat_body, make_config, make_request

CHAT = "/v1/chat/completions"


class FailingEngine(FakeEngine):
    """Streams `after` deltas of its answer, then ends the request with EngineFailed, as VLLMEngine does
    for a choice vLLM finished with 'abort' or 'error'."""

    def __init__(self, after: int, **kw):
        super().__init__(max_model_len=MAX_MODEL_LEN, **kw)
        self.after = after

    async def generate(self, request_id, prompt_token_ids, params):
        # closed on the way out, so the request ends in the engine as it does in vLLM's when it fails one
        async with aclosing(super().generate(request_id, prompt_token_ids, params)) as stream:
            count = 0
            async for delta in stream:
                if count == self.after:
                    raise EngineFailed("the engine ended choice 0 with finish reason 'abort'")
                yield delta
                count += 1


def _idle(host: EngineHost) -> None:
    stats = host.admission.stats()
    assert (stats.in_system, stats.running, stats.waiting, stats.tokens_in_use) == (0, 0, 0, 0)
    assert host.engine.running == set()


@pytest.mark.parametrize("after", [0, 2], ids=["at-the-first-output", "mid-stream"])
async def test_host_raises_service_unavailable_and_stays_healthy(after):
    engine = FailingEngine(after)
    host = EngineHost(make_config().models[0], engine, ServiceConfig())
    request = make_request("hello", max_tokens=20, ignore_eos=True)
    seen = []
    with pytest.raises(ServiceUnavailable, match="without finishing it") as raised:
        async for item in host.generate(request):
            seen.append(item)
    assert raised.value.status == 503 and raised.value.retry_after_s == 1
    if after == 0:
        assert seen == []  # the first output is awaited before Admitted: not even a 200 goes out
    else:
        assert isinstance(seen[0], Admitted) and len(seen) == 1 + after
        assert all(isinstance(d, GenerationDelta) for d in seen[1:])
        assert all(c.finish_reason is None for d in seen[1:] for c in d.choices)  # nothing claims a finish
    assert request.request_id not in engine.aborted  # the engine ended it itself
    await host.check_health()  # not dead: the replica is not replaced for one failed request
    assert (await host.stats()).healthy is True
    _idle(host)
    engine.after = -1  # fails no more: the next request is served to its end
    admitted, *deltas = [item async for item in host.generate(make_request("again", max_tokens=3))]
    assert isinstance(admitted, Admitted) and deltas[-1].choices[0].finish_reason == "length"


async def test_non_stream_body_is_a_503(make_stack):
    stack = make_stack(engine=FailingEngine(after=2))
    resp = await stack.client.post(CHAT, json=chat_body(max_tokens=20, ignore_eos=True))
    assert resp.status_code == 503, resp.text
    error = assert_error_shape(503, resp.headers["content-type"], resp.content)
    assert (error["type"], error["code"]) == ("service_unavailable", "engine_unavailable")
    assert "without finishing it" in error["message"]
    assert int(resp.headers["retry-after"]) >= 1
    assert (await stack.client.get("/health")).status_code == 200
    _idle(stack.host)


async def test_stream_ends_with_an_error_event_then_done(make_stack):
    stack = make_stack(engine=FailingEngine(after=2))
    resp = await stack.client.post(CHAT, json=chat_body(stream=True, max_tokens=20, ignore_eos=True))
    assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
    events = sse.parse(resp.text)
    assert events[-1] == "[DONE]"
    assert set(events[-2]) == {"error"}
    assert (events[-2]["error"]["type"], events[-2]["error"]["code"]) == ("service_unavailable", "engine_unavailable")
    content = events[:-2]
    assert len(content) == 2 and all("choices" in c for c in content)  # what was generated before the failure
    assert all(c["finish_reason"] is None for e in content for c in e["choices"])  # never a silent "stop"
    assert (await stack.client.get("/health")).status_code == 200
    _idle(stack.host)


async def test_stream_failing_at_the_first_output_is_a_plain_503(make_stack):
    """The host waits for the engine's first output before the 200 goes out, so this is still an HTTP error."""
    stack = make_stack(engine=FailingEngine(after=0))
    resp = await stack.client.post(CHAT, json=chat_body(stream=True, max_tokens=20, ignore_eos=True))
    assert resp.status_code == 503, resp.text
    assert assert_error_shape(503, resp.headers["content-type"], resp.content)["code"] == "engine_unavailable"
    _idle(stack.host)
