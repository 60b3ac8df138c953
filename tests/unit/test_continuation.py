"""A request whose replica fails after answering continues on another replica (app/engine/continuation.py, driven by
`ray_backend.HandleBackend`): the client's stream goes on with one `Admitted`, every token once, under the
original choice indices; the continuation's prompt is the prompt's ids plus the choice's own, with the tokens
still allowed; requests whose state stays with the replica end with the retryable 503 instead."""

from __future__ import annotations

from dataclasses import replace

import pytest
from ray.exceptions import ActorDiedError

from app.engine.continuation import Continuation
from app.engine.interface import Admitted, ChoiceDelta, GenerationDelta
from app.errors import RequestQuarantined, RequestTimeout, ServiceUnavailable
from app.rayserve.handle_backend import ATTEMPTS, HandleBackend, Refused
from tests.support.fake_stack import make_request
from tests.support.stand_in_handle import StandInHandle, StandInResponse

PROMPT_IDS = (101, 102, 103)


def delta(index: int, ids: tuple[int, ...], finish: str | None = None, first: bool = False) -> GenerationDelta:
    text = "".join(f"<{i}>" for i in ids)
    return GenerationDelta(choices=(ChoiceDelta(index=index, text=text, num_tokens=len(ids), finish_reason=finish,
                                                token_ids=ids),),
                           prompt_token_ids=PROMPT_IDS if first else None)


def text_of(items: list, index: int = 0) -> str:
    return "".join(c.text for d in items if isinstance(d, GenerationDelta) for c in d.choices if c.index == index)


async def collect(backend: HandleBackend, request) -> list:
    return [item async for item in backend.generate(request)]


async def test_a_stream_lost_after_answering_continues_on_another_replica_with_its_tokens():
    request = make_request("hello", max_tokens=5, temperature=0, seed=7)
    lost = StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True), delta(0, (2,))],
                           fail=ActorDiedError())
    rest = StandInResponse([Admitted(5, replica="r2"), delta(0, (3,), first=True), delta(0, (4, 5), "length")])
    handle = StandInHandle(responses=[lost, rest])
    backend = HandleBackend(handle)
    items = await collect(backend, request)

    assert [i for i in items if isinstance(i, Admitted)] == [Admitted(3, replica="r1")]  # one, the prompt once
    assert text_of(items) == "<1><2><3><4><5>"
    assert sum(c.num_tokens for d in items[1:] for c in d.choices) == 5
    assert items[-1].choices[0].finish_reason == "length"
    # The client did not ask for token ids: none reach it, though the replicas were asked for them.
    assert all(c.token_ids is None for d in items[1:] for c in d.choices)
    assert all(d.prompt_token_ids is None for d in items[1:])
    (_, (first, _)), (_, (resumed, avoid)) = handle.calls
    assert first.params.return_token_ids
    assert resumed.prompt.token_ids == (*PROMPT_IDS, 1, 2)
    assert (resumed.params.max_tokens, resumed.params.n, resumed.params.seed) == (3, 1, 7)
    assert resumed.params.temperature == 0 and resumed.continuation and resumed.resumed_tokens == 2
    assert resumed.params.resumed_output == 2  # the engine counts them as output (engine/vllm/output_resume)
    assert resumed.request_id != request.request_id and resumed.timeout_s <= request.timeout_s
    assert avoid == ("r1",)  # the router leaves the replica that failed out
    assert backend.migrated == {"resumed": 1}


async def test_an_engine_death_refused_mid_stream_moves_and_the_client_s_token_ids_stay_whole():
    request = make_request("hello", max_tokens=4, return_token_ids=True)
    dead = ServiceUnavailable("the engine failed while serving this request; retry shortly", retry_after_s=5)
    lost = StandInResponse([Admitted(3, replica="r1"), delta(0, (1, 2), first=True), Refused(dead, "r1")])
    rest = StandInResponse([Admitted(5, replica="r2"), delta(0, (3,), first=True), delta(0, (4,), "length")])
    items = await collect(HandleBackend(StandInHandle(responses=[lost, rest])), request)
    assert [c.token_ids for d in items[1:] for c in d.choices] == [(1, 2), (3,), (4,)]
    assert [d.prompt_token_ids for d in items[1:]] == [PROMPT_IDS, None, None]  # the prompt's once, at the start


async def test_with_n_2_only_the_unfinished_choice_resumes_under_its_own_index():
    request = make_request("hello", max_tokens=3, n=2)
    lost = StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True), delta(1, (7,)),
                            delta(0, (2, 3), "length")], fail=ActorDiedError())
    rest = StandInResponse([Admitted(4, replica="r2"), delta(0, (8, 9), "length", first=True)])
    handle = StandInHandle(responses=[lost, rest])
    items = await collect(HandleBackend(handle), request)
    assert (text_of(items, 0), text_of(items, 1)) == ("<1><2><3>", "<7><8><9>")
    assert len(handle.calls) == 2
    resumed = handle.calls[1][1][0]
    assert resumed.prompt.token_ids == (*PROMPT_IDS, 7) and resumed.params.max_tokens == 2


async def test_with_n_2_both_unfinished_choices_resume_side_by_side():
    request = make_request("hello", max_tokens=2, n=2)
    lost = StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True), delta(1, (5,))],
                           fail=ActorDiedError())
    # The stand-in answers both continuations in call order; each is a one-choice stream at index 0.
    handle = StandInHandle(responses=[lost, StandInResponse([Admitted(4), delta(0, (2,), "length", first=True)]),
                                      StandInResponse([Admitted(4), delta(0, (6,), "length", first=True)])])
    items = await collect(HandleBackend(handle), request)
    assert sorted((text_of(items, 0), text_of(items, 1))) == ["<1><2>", "<5><6>"]
    prompts = sorted(call[1][0].prompt.token_ids for call in handle.calls[1:])
    assert prompts == [(*PROMPT_IDS, 1), (*PROMPT_IDS, 5)]
    finishes = [c.finish_reason for d in items[1:] for c in d.choices if c.finish_reason]
    assert finishes == ["length", "length"]


async def test_a_continuation_lost_again_moves_again_until_the_attempts_run_out():
    request = make_request("hello", max_tokens=10)
    first = StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True)], fail=ActorDiedError())
    again = [StandInResponse([Admitted(4, replica=f"r{i + 2}"), delta(0, (2 + i,), first=True)],
                             fail=ActorDiedError()) for i in range(ATTEMPTS)]
    handle = StandInHandle(responses=[first, *again])
    seen = []
    backend = HandleBackend(handle)
    with pytest.raises(ServiceUnavailable):
        async for item in backend.generate(request):
            seen.append(item)
    assert text_of(seen) == "<1>" + "".join(f"<{2 + i}>" for i in range(ATTEMPTS))  # nothing repeated
    assert handle.calls[-1][1][0].prompt.token_ids == (*PROMPT_IDS, *range(1, 1 + ATTEMPTS))
    assert backend.migrated == {"resumed": ATTEMPTS}


AUTO = {"auto_tools": ({"type": "function", "function": {"name": "f"}},)}


def parsed(index: int, ids: tuple[int, ...], raw: str, first: bool = False) -> GenerationDelta:
    """A piece of a tool_choice "auto" stream: the parser read `raw` and let none of it through as content."""
    return GenerationDelta(choices=(ChoiceDelta(index=index, text="", num_tokens=len(ids), token_ids=ids,
                                                parsed_text=raw),), prompt_token_ids=PROMPT_IDS if first else None)


async def test_a_tool_choice_auto_answer_continues_with_what_its_parser_read_replayed():
    lost = StandInResponse([Admitted(3, replica="r1"), parsed(0, (1,), "<tool_call>", first=True),
                            parsed(0, (2, 3), '{"name"')], fail=ActorDiedError())
    rest = StandInResponse([Admitted(6, replica="r2"), parsed(0, (4,), ': "f"', first=True)])
    handle = StandInHandle(responses=[lost, rest])
    backend = HandleBackend(handle)
    items = await collect(backend, make_request("hello", max_tokens=5, **AUTO))
    assert sum(c.num_tokens for d in items[1:] for c in d.choices) == 4 and backend.migrated == {"resumed": 1}
    resumed = handle.calls[1][1][0]
    assert resumed.params.parser_replay == (("<tool_call>", (1,)), ('{"name"', (2, 3)))
    assert resumed.params.auto_tools == AUTO["auto_tools"] and resumed.prompt.token_ids == (*PROMPT_IDS, 1, 2, 3)


async def test_a_tool_choice_auto_answer_with_stop_strings_leaves_them_to_the_replica_and_continues():
    """Beside a tool-call parser the stop strings are matched on the replica, before the parser (the text the
    client gets is the parser's content): this layer passes the text on as it comes and sends them along."""
    lost = StandInResponse([Admitted(3, replica="r1"), parsed(0, (1,), "<tool_call>", first=True)],
                           fail=ActorDiedError())
    rest = StandInResponse([Admitted(4, replica="r2"),
                            GenerationDelta(choices=(ChoiceDelta(index=0, text="en", num_tokens=1, token_ids=(2,),
                                                                 parsed_text="end", finish_reason="stop"),))])
    handle = StandInHandle(responses=[lost, rest])
    backend = HandleBackend(handle)
    items = await collect(backend, make_request("hello", max_tokens=5, stop=("end",), **AUTO))
    assert text_of(items) == "en" and backend.migrated == {"resumed": 1}  # not held back nor cut here
    first, resumed = handle.calls[0][1][0], handle.calls[1][1][0]
    assert first.params.stop == ("end",) and not first.params.include_stop_str_in_output
    assert resumed.params.stop == ("end",) and resumed.params.parser_replay == (("<tool_call>", (1,)),)


async def test_a_tool_choice_auto_answer_whose_replica_did_not_say_what_its_parser_read_ends_with_a_retryable_error():
    first = delta(0, (1,), first=True)
    handle = StandInHandle(responses=[StandInResponse([Admitted(3, replica="r1"), first], fail=ActorDiedError())])
    backend = HandleBackend(handle)
    with pytest.raises(ServiceUnavailable, match="cannot continue on another replica") as raised:
        await collect(backend, make_request("hello", **AUTO))
    assert raised.value.status == 503 and raised.value.retry_after_s
    assert len(handle.calls) == 1 and backend.migrated == {"unresumable": 1}


@pytest.mark.parametrize("params", [{"json_schema": {"type": "object"}}, {"json_object": True}, {"regex": "[a-z]+"},
                                    {"presence_penalty": 1.0, "frequency_penalty": 0.5}, {"bad_words": ("ab",)}],
                         ids=["json_schema", "json_object", "regex", "penalties", "bad_words"])
async def test_a_structured_or_penalised_answer_continues_with_its_output_counted_as_output(params):
    lost = StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True), delta(0, (2,))],
                           fail=ActorDiedError())
    rest = StandInResponse([Admitted(5, replica="r2"), delta(0, (3,), "stop", first=True)])
    handle = StandInHandle(responses=[lost, rest])
    backend = HandleBackend(handle)
    items = await collect(backend, make_request("hello", max_tokens=5, **params))
    assert text_of(items) == "<1><2><3>" and backend.migrated == {"resumed": 1}
    resumed = handle.calls[1][1][0]
    assert resumed.params.resumed_output == 2 and resumed.prompt.token_ids == (*PROMPT_IDS, 1, 2)
    assert {k: getattr(resumed.params, k) for k in params} == params  # the constraint and penalties go along


async def test_a_request_that_failed_for_its_own_sake_does_not_move():
    timeout = RequestTimeout("The request ran past its time limit")
    handle = StandInHandle(responses=[StandInResponse([Admitted(3), delta(0, (1,), first=True), Refused(timeout)])])
    with pytest.raises(RequestTimeout):
        await collect(HandleBackend(handle), make_request("hello"))
    assert len(handle.calls) == 1


async def test_lost_before_any_token_resends_the_original_prompt():
    request = make_request("hello", max_tokens=2)
    handle = StandInHandle(responses=[StandInResponse([Admitted(3, replica="r1")], fail=ActorDiedError()),
                                      StandInResponse([Admitted(3), delta(0, (1, 2), "length", first=True)])])
    items = await collect(HandleBackend(handle), request)
    assert text_of(items) == "<1><2>" and len([i for i in items if isinstance(i, Admitted)]) == 1
    resumed = handle.calls[1][1][0]
    assert resumed.prompt == request.prompt and resumed.resumed_tokens == 0 and resumed.params.max_tokens == 2


def test_a_continuation_keeps_a_default_max_tokens_a_default_and_lowers_min_tokens():
    progress = Continuation(make_request("hello", max_tokens=8, max_tokens_is_default=True, min_tokens=3))
    progress.observe(Admitted(3))
    progress.observe(delta(0, (1, 2), first=True))
    resumed = progress.resume(0, timeout_s=10)
    assert resumed.params.max_tokens == 6 and resumed.params.max_tokens_is_default  # the replica fits it
    assert resumed.params.min_tokens == 1 and resumed.timeout_s == 10


async def test_the_replica_counts_a_continuation_s_resumed_tokens_against_the_context_not_the_prompt_limit():
    """limits.max_prompt_tokens 8 (on a context of MAX_MODEL_LEN): a continuation of a 6-token prompt with 5
    tokens already generated has an 11-token prompt, and is served; the same 11 tokens as a new prompt are not."""
    from dataclasses import replace

    from app.config.service import ServiceConfig
    from app.engine.fake import FakeEngine
    from app.engine.interface import PromptInput
    from app.errors import ContextLengthExceeded
    from app.host.engine_host import EngineHost
    from tests.support.fake_stack import MAX_MODEL_LEN, make_config

    model = make_config(limits={"max_prompt_tokens": 8}).models[0]
    host = EngineHost(model, FakeEngine(max_model_len=MAX_MODEL_LEN), ServiceConfig())
    request = make_request(PromptInput(token_ids=tuple(range(1, 12))), max_tokens=3)
    with pytest.raises(ContextLengthExceeded):
        await anext(host.generate(request))
    resumed = replace(request, continuation=True, resumed_tokens=5)
    items = [item async for item in host.generate(resumed)]
    assert isinstance(items[0], Admitted) and items[0].prompt_tokens == 11
    assert sum(c.num_tokens for d in items[1:] for c in d.choices) == 3


def test_migrations_are_counted_in_the_metrics_by_outcome():
    from app.http.metrics import Metrics

    text = Metrics().render({}, {}, {"m": {"resumed": 3, "unresumable": 1}}).decode()
    assert 'app_requests_migrated_total{model_name="m",outcome="resumed"} 3.0' in text
    assert 'app_requests_migrated_total{model_name="m",outcome="unresumable"} 1.0' in text


async def test_a_continuation_with_no_context_left_for_its_default_max_tokens_ends_at_once_with_length():
    """The first replica shrank a default max_tokens to the context; lost after its last token, the resume has
    nothing left to generate: it ends `length` instead of sending the engine a request for 0 tokens (a 400)."""
    from dataclasses import replace

    from app.config.service import ServiceConfig
    from app.engine.fake import FakeEngine
    from app.engine.interface import PromptInput
    from app.host.engine_host import EngineHost
    from tests.support.fake_stack import MAX_MODEL_LEN, make_config

    host = EngineHost(make_config().models[0], FakeEngine(max_model_len=MAX_MODEL_LEN), ServiceConfig())
    full = PromptInput(token_ids=tuple(range(1, MAX_MODEL_LEN + 1)))
    request = replace(make_request(full, max_tokens=1000, max_tokens_is_default=True), continuation=True,
                      resumed_tokens=40)
    items = [item async for item in host.generate(request)]
    assert isinstance(items[0], Admitted)
    assert [(c.num_tokens, c.finish_reason) for d in items[1:] for c in d.choices] == [(0, "length")]


async def test_a_request_whose_time_runs_out_while_it_moves_is_a_504_not_a_503():
    request = make_request("hello", max_tokens=10, timeout_s=1e-9)  # spent by the time its replica is found dead
    lost = StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True)], fail=ActorDiedError())
    handle = StandInHandle(responses=[lost])
    with pytest.raises(RequestTimeout) as raised:
        await collect(HandleBackend(handle), request)
    assert raised.value.status == 504 and len(handle.calls) == 1


async def test_a_request_that_waited_on_a_wedged_engine_goes_to_the_next_replica_marked_to_be_given_time():
    """Never a cascade: if the request was the slow one, the next replica's watch must not wedge on it too."""
    from app.errors import EngineWedged

    wedged = EngineWedged("the engine stopped serving while this request was in it (wedged); retry", retry_after_s=5)
    handle = StandInHandle(responses=[StandInResponse([Refused(wedged, "r1")]),
                                      StandInResponse([Admitted(3), delta(0, (1,), "length", first=True)])])
    items = await collect(HandleBackend(handle), make_request("hello", max_tokens=1))
    assert text_of(items) == "<1>"
    (_, (first, _)), (_, (again, avoid)) = handle.calls
    assert not first.after_wedge and again.after_wedge and avoid == ("r1",)


async def test_a_request_that_misses_its_target_even_alone_is_not_tried_on_other_replicas():
    from app.errors import NeverInTime

    never = NeverInTime("This request's first token is predicted in 90.0 s even with this replica to itself")
    handle = StandInHandle(responses=[StandInResponse([Refused(never, "r1")]),
                                      StandInResponse([Admitted(3), delta(0, (1,), "length", first=True)])])
    with pytest.raises(NeverInTime):
        await collect(HandleBackend(handle), make_request("hello", max_tokens=1))
    assert len(handle.calls) == 1  # rendering and tokenizing it again elsewhere would cost the same refusal


async def test_a_lone_replica_restarting_its_engine_is_waited_for_and_the_choice_continues_there(monkeypatch):
    """The ingress tier with one engine replica (an autoscaled model at its minimum): its engine dies under a stream
    and every try of the continuation is refused while the engine restarts in place; the continuation waits until
    the replica reports that it serves again, and goes on there."""
    from app.host.replica_load import ReplicaLoad
    from app.rayserve import handle_backend

    monkeypatch.setattr(handle_backend, "REFUSED_PAUSE_S", 0.0)
    monkeypatch.setattr(handle_backend, "WAIT_POLL_S", 0.001)
    restarting = ServiceUnavailable("the engine for 'm' is restarting (died); retry shortly", retry_after_s=5)
    lost = StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True)], fail=ActorDiedError())
    refusals = [StandInResponse([Refused(restarting, "r1")]) for _ in range(ATTEMPTS)]  # one try per attempt
    back = StandInResponse([Admitted(4, replica="r1"), delta(0, (2, 3), "length", first=True)])
    handle = StandInHandle(responses=[lost, *refusals, back])
    backend = HandleBackend(handle)
    polls = []

    def loads() -> dict[str, ReplicaLoad]:
        polls.append(len(handle.calls))
        return {"r1": ReplicaLoad(serving=len(polls) > 20)}  # restarting for the first 20 looks

    monkeypatch.setattr(backend, "_loads", loads)
    items = await collect(backend, make_request("hello", max_tokens=3))
    assert text_of(items) == "<1><2><3>" and items[-1].choices[0].finish_reason == "length"
    assert len(polls) > 20 and len(handle.calls) == 2 + ATTEMPTS  # waited, and tried again only once it served
    assert backend.migrated == {"resumed": 1}  # the one engine that took the choice


async def test_a_request_whose_engine_broke_after_answering_and_again_before_its_continuation_answered_is_held():
    """engine/quarantine.py: a break after the first output counts, carried by the continuation; its second break
    ends the request (no third replica) and holds the whole request, so that a retry of it is refused at once."""
    broke = ServiceUnavailable("the engine failed while serving this request", retry_after_s=5)
    request = make_request("POISON", max_tokens=5)
    handle = StandInHandle(responses=[
        StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True), Refused(broke, "r1", in_flight=True)]),
        StandInResponse([Refused(broke, "r2", in_flight=True)]),
        StandInResponse([Admitted(4, replica="r3"), delta(0, (2, 3, 4, 5), "length", first=True)])])
    backend, items = HandleBackend(handle), []
    with pytest.raises(RequestQuarantined, match="failed 2 times"):
        async for item in backend.generate(request):
            items.append(item)
    assert text_of(items) == "<1>" and len(handle.calls) == 2  # what the client had, then the error; no third
    with pytest.raises(RequestQuarantined, match="held back"):
        await collect(backend, replace(request, request_id="again"))
    assert len(handle.calls) == 2


async def test_a_replica_that_died_under_an_answer_is_no_break_of_its_request():
    broke = ServiceUnavailable("the engine failed while serving this request", retry_after_s=5)
    handle = StandInHandle(responses=[
        StandInResponse([Admitted(3, replica="r1"), delta(0, (1,), first=True)], fail=ActorDiedError()),
        StandInResponse([Refused(broke, "r2", in_flight=True)]),
        StandInResponse([Admitted(4, replica="r3"), delta(0, (2, 3, 4, 5), "length", first=True)])])
    items = await collect(HandleBackend(handle), make_request("a node lost", max_tokens=5))
    assert text_of(items) == "<1><2><3><4><5>" and len(handle.calls) == 3
