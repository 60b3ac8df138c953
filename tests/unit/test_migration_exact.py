"""A continued answer is exactly the answer (issue 27): a request whose replica dies after any number of
outputs, continued on another (app/engine/continuation.py through `HandleBackend`), gives the client the text,
finish reason, stop reason, token count and token ids that the same request gets from one replica undisturbed.
The replicas are `EngineHost`s over fake engines that stream as vLLM does (stop strings held back, choice i
seeded with seed + i, a prompt ending in the engine's own ids continued)."""

from __future__ import annotations

import asyncio
from contextlib import aclosing
from dataclasses import replace

import pytest
from ray.exceptions import ActorDiedError

from app.config.service import ServiceConfig
from app.engine.fake import FakeEngine
from app.engine.interface import Admitted, GenerationDelta
from app.errors import ServiceError
from app.host.engine_host import EngineHost
from app.rayserve.handle_backend import HandleBackend, Refused
from tests.support.fake_stack import MAX_MODEL_LEN, make_config, make_request


class _Replica:
    def __init__(self, name: str, token_delay_s: float = 0.0):
        self.name = name
        self.engine = FakeEngine(max_model_len=MAX_MODEL_LEN, token_delay_s=token_delay_s)
        self.host = EngineHost(make_config().models[0], self.engine, ServiceConfig())


class _Response:
    """One `generate_remote` call on a replica; `dies_after`: items it sends before its replica dies."""

    def __init__(self, replica: _Replica, request, dies_after: int | None):
        self.replica, self.request, self.dies_after = replica, request, dies_after

    def __aiter__(self):
        self.items = self._items()
        return self.items

    async def _items(self):
        sent = 0
        try:
            async with aclosing(self.replica.host.generate(self.request)) as items:
                async for item in items:
                    if self.dies_after is not None and sent >= self.dies_after:
                        raise ActorDiedError()
                    sent += 1
                    yield replace(item, replica=self.replica.name) if isinstance(item, Admitted) else item
        except ServiceError as err:
            yield Refused(err, self.replica.name)

    def cancel(self) -> None:  # as Ray's: the replica's generator is cancelled, and the host aborts the engine's
        asyncio.ensure_future(self.items.aclose())


class _Handle:
    """A DeploymentHandle over fake replicas: the first call's replica dies after `dies_after` items, every later
    call goes to a healthy one."""

    def __init__(self, dies_after: int | None, token_delay_s: float = 0.0):
        self.dies_after = dies_after
        self.replicas = [_Replica("r1", token_delay_s), _Replica("r2", token_delay_s)]
        self.requests: list = []
        self.generate_remote = self

    def options(self, **_):
        return self

    def remote(self, request, avoid=()):
        first = not self.requests
        self.requests.append(request)
        return _Response(self.replicas[0 if first else 1], request, self.dies_after if first else None)


def _answer(items: list) -> dict[int, tuple]:
    """Per choice: text, finish reason, stop reason, tokens, token ids, tool-call pieces (with or without an id: the
    ids are fresh per request); as the client's answer has them."""
    out: dict[int, list] = {}
    for item in items:
        if not isinstance(item, GenerationDelta):
            continue
        for c in item.choices:
            text, finish, stop, tokens, ids, calls = out.setdefault(c.index, ["", None, None, 0, [], []])
            out[c.index] = [text + c.text, c.finish_reason or finish, c.stop_reason if c.finish_reason else stop,
                            tokens + c.num_tokens, ids + list(c.token_ids or ()),
                            calls + [(d.index, d.name, d.arguments, d.id is not None) for d in c.tool_calls]]
    return {i: tuple(v[:4]) + (tuple(v[4]), tuple(v[5])) for i, v in sorted(out.items())}


async def _through_handle(request, dies_after: int | None, token_delay_s: float = 0.0) -> tuple[dict, _Handle]:
    handle = _Handle(dies_after, token_delay_s)
    items = [item async for item in HandleBackend(handle).generate(request)]
    assert sum(isinstance(i, Admitted) for i in items) == 1
    return _answer(items), handle


async def _on_one_replica(request) -> dict:
    return _answer([item async for item in _Replica("alone").host.generate(request)])


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}
CASES = {
    "greedy": dict(max_tokens=7, temperature=0),
    "stop spanning tokens": dict(max_tokens=12, temperature=0, stop=("answer from",)),
    "long stop strings held back": dict(max_tokens=12, temperature=0, stop=("the test engine", "x" * 40)),
    "stop never met": dict(max_tokens=6, temperature=0, stop=("nowhere to be found",)),
    "stop kept in output": dict(max_tokens=12, temperature=0, stop=("fake ans",), include_stop_str_in_output=True),
    "stop past min_tokens": dict(max_tokens=12, temperature=0, stop=("is", "test"), min_tokens=4),
    "stop with stop_token_ids": dict(max_tokens=12, temperature=0, stop=("answer",), stop_token_ids=(7,)),
    "n 3 seeded": dict(max_tokens=6, n=3, temperature=0.8, seed=11),
    "n 2 seeded with stop and ids": dict(max_tokens=12, n=2, temperature=0.8, seed=3, stop=("from t",),
                                         return_token_ids=True),
    "tool_choice auto": dict(max_tokens=6, n=2, temperature=0, auto_tools=(TOOL,)),
    "tool_choice auto with stop": dict(max_tokens=12, n=2, temperature=0, auto_tools=(TOOL,), stop=("answer from",)),
    "tool_choice auto with stop past min_tokens": dict(max_tokens=12, temperature=0, auto_tools=(TOOL,),
                                                       stop=("is", "test"), min_tokens=4),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
async def test_an_answer_continued_after_any_output_equals_the_undisturbed_answer(case):
    request = make_request([{"role": "user", "content": "hi"}], **CASES[case])
    alone = await _on_one_replica(request)
    undisturbed, _ = await _through_handle(request, dies_after=None)
    assert undisturbed == alone  # stop strings matched at the ingress give the engine's own answer
    outputs = 1 + max(v[3] for v in alone.values())  # Admitted, then at most one output per step
    for dies_after in range(1, outputs + 1):
        continued, handle = await _through_handle(request, dies_after)
        assert continued == alone, f"replica died after {dies_after} item(s)"
        assert len(handle.requests) >= 1


async def test_a_resumed_choice_is_sampled_with_its_own_seed():
    request = make_request("hello", max_tokens=4, n=2, temperature=1.0, seed=40)
    _, handle = await _through_handle(request, dies_after=1)  # lost before any token
    seeds = sorted(r.params.seed for r in handle.requests[1:])
    assert seeds == [40, 41]


async def test_a_stop_string_met_across_the_cut_ends_the_resumed_stream_at_once():
    """The next replica's engine sees only its own text; the match is made where all of it is, and the
    continuation is closed (aborted on its replica) rather than left running. (The engine takes a little time a
    token, as a real one does: the replica reads its outputs ahead of the ingress, app/host/pauses.py.)"""
    request = make_request("hello", max_tokens=30, temperature=0, stop=("fake answer",))
    alone = await _on_one_replica(request)
    continued, handle = await _through_handle(request, dies_after=5, token_delay_s=0.02)  # "This is a fake " out
    assert continued == alone and alone[0][1:3] == ("stop", "fake answer")
    resumed = handle.requests[1].request_id
    await handle.replicas[1].engine.wait_aborted(resumed)


def test_a_continuation_asks_nothing_of_the_prompt_s_logprobs():
    from app.engine.continuation import Continuation

    progress = Continuation(make_request("hello", max_tokens=8, prompt_logprobs=2))
    assert progress.for_engine().params.prompt_logprobs == 2
    assert progress.resume(0, timeout_s=5).params.prompt_logprobs is None
