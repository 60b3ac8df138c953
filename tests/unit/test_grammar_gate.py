"""The grammar gate (app/engine/vllm/grammar_gate.py) on the default model's tokenizer: a grammar that compiles in time
passes, one that would take the engine minutes is refused once its deadline passes (its compile killed with the
worker, which starts again for the next), a verdict is kept, what the compiler refuses is refused with its words, a
schema vLLM would check with outlines is refused without a compile, and the worker's turns are shared among senders."""

from __future__ import annotations

import asyncio
import json

import psutil
import pytest
from vllm.sampling_params import StructuredOutputsParams

from app.config.model import DEFAULT_MODEL_SOURCE
from app.engine.model_store import resolve_source
from app.engine.vllm.grammar_backend import XgrammarPin
from app.engine.vllm.grammar_gate import GrammarGate, Unenforceable, _Turns, compiled_as

# 3,000 optional literals: within the size bounds, minutes of compiling (13 s at 400, growing as n^2.2).
BOMB = StructuredOutputsParams(grammar="root ::= " + " ".join(['"a"?'] * 3000))
WEATHER = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.fixture
def gate():
    g = GrammarGate(resolve_source(DEFAULT_MODEL_SOURCE), 49152, False, deadline_s=2.0)
    yield g
    g.close()


def _worker(g: GrammarGate) -> psutil.Process:
    assert g._worker is not None
    return psutil.Process(g._worker.pid)


async def test_a_grammar_past_the_deadline_is_refused_and_its_compile_killed(gate: GrammarGate):
    # One test: each worker's start (imports and the tokenizer) takes about 5 s on two cores.
    assert await gate.check(StructuredOutputsParams(json=WEATHER)) is None
    first = _worker(gate)
    # Its client gone while it compiles: the compile goes on to its verdict, and the worker's answer to it is never
    # read as the answer to the next constraint.
    gone = asyncio.ensure_future(gate.check(BOMB))
    while not first.children():  # its compile under way, in a child the worker forked
        await asyncio.sleep(0.01)
    compiling = first.children()[0]
    gone.cancel()
    assert await gate.check(StructuredOutputsParams(regex="[a-z]+@[a-z]+")) is None  # the same worker compiled it
    assert not compiling.is_running() or compiling.status() == psutil.STATUS_ZOMBIE  # killed at the deadline
    assert _worker(gate).pid == first.pid  # the worker stays: no start to wait for before the next compile
    why = await gate.check(BOMB)  # kept: refused without compiling again
    assert why is not None and "did not compile within 2 s" in why and "simplify it" in why
    # What the compiler refuses, the engine's would too (after admission, with nothing to say but "error").
    why = await gate.check(StructuredOutputsParams(grammar="root ::= undefined_rule"))
    assert why is not None and "could not be compiled (xgrammar: " in why and "undefined_rule" in why, why
    # One that compiles without xgrammar's cache and fails with it, as the engine's compiler has it (a 503 "retry"
    # before the gate: the engine ended the request with "error").
    pattern = {"type": "object", "patternProperties": {"^(a|b){50}x{1,500}$": {"type": "string"}}}
    why = await gate.check(StructuredOutputsParams(json=pattern))
    assert why is not None and "Check failed" in why, why
    # What needs no compile, or what vLLM's own checks refuse with their words, is the engine's to decide.
    assert await gate.check(StructuredOutputsParams(json_object=True)) is None
    assert await gate.check(None) is None
    assert await gate.check(StructuredOutputsParams(json="{not json")) is None  # vLLM's checks refuse it


def test_it_compiles_what_vllms_xgrammar_backend_would():
    assert compiled_as(StructuredOutputsParams(json=WEATHER)) == ("json", json.dumps(WEATHER))
    assert compiled_as(StructuredOutputsParams(json=json.dumps(WEATHER))) == ("json", json.dumps(WEATHER))
    assert compiled_as(StructuredOutputsParams(regex="a+")) == ("regex", "a+")
    kind, spec = compiled_as(StructuredOutputsParams(choice=["yes", "no"])) or ("", "")
    assert kind == "ebnf" and '"yes"' in spec and '"no"' in spec
    assert compiled_as(StructuredOutputsParams(grammar='root ::= "a"'))[0] == "ebnf"  # type: ignore[index]
    assert compiled_as(StructuredOutputsParams(grammar='start: "a"'))[0] == "lark"  # type: ignore[index]
    assert compiled_as(StructuredOutputsParams(json_object=True)) is None
    with pytest.raises(ValueError):  # GrammarGate.check leaves it to vLLM's checks, which refuse it with a 400
        compiled_as(StructuredOutputsParams(json="{not json"))
    # A keyword xgrammar lacks: checked by guidance in vLLM's front end, compiled by xgrammar in the engine (which
    # ignores it; grammar_backend.py pins the engine's backend), so compiled as xgrammar here.
    multiple = {"type": "integer", "multipleOf": 3}
    assert compiled_as(StructuredOutputsParams(json=multiple)) == ("json", json.dumps(multiple))
    # One guidance lacks too (patternProperties): vLLM would check it with outlines.
    with pytest.raises(Unenforceable):
        compiled_as(StructuredOutputsParams(json={**multiple, "patternProperties": {"^a": {}}}))


async def test_a_schema_vllm_would_check_with_outlines_is_refused_at_once(gate: GrammarGate):
    # 3,000 properties and a patternProperties: vLLM's "auto" sent it to outlines, whose check parsed its regex with
    # Python's `re` in the replica's process for minutes (Serve's health check then killed the replica).
    schema = {"type": "object", "properties": {f"p{i}": {"type": "string"} for i in range(3000)},
              "patternProperties": {"^z": {"type": "string"}}}
    why = await gate.check(StructuredOutputsParams(json=schema))
    assert why is not None and "outlines" in why and "Remove the patternProperties" in why, why
    assert gate._worker is not None and not gate._ready  # decided without a compile


async def test_a_gate_that_cannot_start_leaves_every_constraint_to_the_engine():
    gate = GrammarGate("/nonexistent-folder", 49152, False, deadline_s=2.0)
    gate._command = ["/nonexistent/python"]  # as if the interpreter could not be started again
    gate._kill()
    try:
        assert await gate.check(BOMB) is None  # the engine decides, as before the gate: never a 500
        assert gate._broken
    finally:
        gate.close()


async def test_a_compile_in_flight_when_the_gate_closes_starts_no_worker_after_it(gate: GrammarGate):
    assert await gate.check(StructuredOutputsParams(json=WEATHER)) is None  # its worker ready
    in_flight = asyncio.ensure_future(gate.check(BOMB))
    while not _worker(gate).children():  # the bomb under way, in a child the worker forked
        await asyncio.sleep(0.01)
    compiling = _worker(gate).children()
    gate.close()  # the engine's shutdown
    await in_flight  # its compile ended with the worker
    assert gate._worker is None
    psutil.wait_procs(compiling, timeout=10)  # the compile's child too (it is killed when its worker dies)
    assert not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in compiling)


async def test_the_worker_turns_go_to_the_sender_waiting_longest_whatever_each_has_queued():
    turns = _Turns()
    order: list[str] = []
    release = asyncio.Event()

    async def compile_as(sender: str, hold: bool = False) -> None:
        async with turns.turn(sender):
            order.append(sender)
            if hold:
                await release.wait()

    first = asyncio.ensure_future(compile_as("flood", hold=True))
    while not turns.busy:
        await asyncio.sleep(0)
    floods = [asyncio.ensure_future(compile_as("flood")) for _ in range(4)]
    await asyncio.sleep(0)
    polite = asyncio.ensure_future(compile_as("polite"))
    gone = asyncio.ensure_future(compile_as("gone"))
    await asyncio.sleep(0)
    gone.cancel()  # a waiter cancelled leaves no turn behind
    release.set()
    await asyncio.gather(first, polite, *floods)
    # The polite sender's one compile goes right after the one under way, not behind the flood's four.
    assert order == ["flood", "polite", "flood", "flood", "flood", "flood"]
    assert not turns.busy


class _FakeLLM:
    """AsyncLLM's generate as the pin uses it: records each request's structured output, fails when told to."""

    def __init__(self) -> None:
        self.sent: list[object] = []
        self.fail = False

    async def generate(self, prompt, params, request_id):
        self.sent.append(params.structured_outputs)
        await asyncio.sleep(0.01)
        if self.fail:
            raise RuntimeError("engine down")
        yield object()


async def test_the_engines_backend_is_pinned_once_before_its_first_constraint_and_again_after_a_failure():
    llm = _FakeLLM()
    pin = XgrammarPin(llm, [42])  # type: ignore[arg-type]
    llm.fail = True
    with pytest.raises(RuntimeError):
        await pin.ensure()
    llm.fail = False
    await asyncio.gather(*(pin.ensure() for _ in range(5)))  # tried again; one request for all five waiting
    await pin.ensure()
    assert [s.json_object for s in llm.sent] == [True, True]  # type: ignore[attr-defined]


async def test_the_gate_pins_the_engine_for_what_it_lets_through_only():
    llm = _FakeLLM()
    gate = GrammarGate("/nonexistent-folder", 49152, False, deadline_s=2.0, pin=XgrammarPin(llm, [42]))  # type: ignore[arg-type]
    try:
        assert await gate.check(None) is None and not llm.sent  # no constraint: nothing to pin
        outlines = {"type": "integer", "multipleOf": 3, "patternProperties": {"^a": {}}}
        assert await gate.check(StructuredOutputsParams(json=outlines)) is not None and not llm.sent
        assert await gate.check(StructuredOutputsParams(json_object=True)) is None and len(llm.sent) == 1
    finally:
        gate.close()
