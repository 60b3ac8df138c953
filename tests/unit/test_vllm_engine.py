"""`VLLMEngine`'s conversions, without starting an engine: neutral parameters to vLLM's `SamplingParams`,
vLLM's per-choice output (`CompletionOutput`, built here with vLLM's own classes and logprob builders)
to the neutral `ChoiceDelta`, and `generate` around a stand-in for `AsyncLLM`."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from vllm import SamplingParams
from vllm.logprobs import append_logprobs_for_next_position, create_sample_logprobs
from vllm.outputs import CompletionOutput
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.exceptions import EngineDeadError, EngineGenerateError

from app.engine.cpu.core_plan import CorePlan
from app.engine.interface import EngineDead, EngineFailed, EngineRejected, GenerationParams
from app.engine.vllm import engine as vllm_engine
from app.engine.vllm.from_vllm import choice_delta, finite, step_choices, token_logprobs
from app.engine.vllm.to_vllm import sampling_params
from app.errors import InvalidRequest

EOS = 2  # a token id standing for end-of-sequence


# -- parameters --------------------------------------------------------------------------------

def test_sampling_params_carry_every_neutral_field():
    params = GenerationParams(max_tokens=7, n=3, temperature=0.5, top_p=0.9, stop=("a", "bc"), seed=11,
                              presence_penalty=0.25, frequency_penalty=-0.5, logprobs=2, ignore_eos=True)
    sp = sampling_params(params)
    assert isinstance(sp, SamplingParams)
    assert (sp.n, sp.max_tokens, sp.temperature, sp.top_p, sp.seed) == (3, 7, 0.5, 0.9, 11)
    assert sp.stop == ["a", "bc"]
    assert (sp.presence_penalty, sp.frequency_penalty) == (0.25, -0.5)
    assert sp.logprobs == 2 and sp.ignore_eos is True
    assert sp.structured_outputs is None
    assert sp.output_kind == RequestOutputKind.DELTA  # the host streams deltas, never the text so far


def test_sampling_params_defaults_leave_vllm_defaults():
    sp = sampling_params(GenerationParams(max_tokens=4))
    assert sp.stop == [] and sp.seed is None and sp.logprobs is None and sp.ignore_eos is False
    assert sp.n == 1 and sp.temperature == 1.0 and sp.top_p == 1.0


def test_sampling_params_structured_output():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    by_schema = sampling_params(GenerationParams(max_tokens=4, json_schema=schema)).structured_outputs
    assert by_schema is not None and by_schema.json == schema and not by_schema.json_object
    any_object = sampling_params(GenerationParams(max_tokens=4, json_object=True)).structured_outputs
    assert any_object is not None and any_object.json_object is True and any_object.json is None
    # a schema wins over json_object (the protocol sends one or the other; the schema is the stricter)
    both = sampling_params(GenerationParams(max_tokens=4, json_schema=schema, json_object=True)).structured_outputs
    assert both.json == schema


# -- logprobs ----------------------------------------------------------------------------------

def test_finite_clamps_minus_infinity_and_nan_only():
    assert finite(-math.inf) == -9999.0
    assert finite(math.nan) == -9999.0
    assert finite(-12345.0) == -9999.0
    assert finite(-1.5) == -1.5
    assert finite(0.0) == 0.0


def _output(steps, finish_reason=None, stop_reason=None, flat=False, index=0) -> CompletionOutput:
    """A CompletionOutput whose logprobs vLLM's own builder filled: `steps` are (sampled id, its rank,
    [(id, logprob, text)] ranked from the top) per position."""
    logprobs = create_sample_logprobs(flat)
    token_ids = []
    for sampled, rank, ranked in steps:
        ids = [sampled] + [i for i, _, _ in ranked]
        values = {i: (lp, text) for i, lp, text in ranked}
        lps = [values[i][0] for i in ids]
        texts = [values[i][1] for i in ids]
        append_logprobs_for_next_position(logprobs, ids, lps, texts, rank, len(ranked))
        token_ids.append(sampled)
    text = "".join(dict((i, t) for i, _, t in ranked)[s] for s, _, ranked in steps)
    return CompletionOutput(index=index, text=text, token_ids=token_ids, cumulative_logprob=None,
                            logprobs=logprobs, finish_reason=finish_reason, stop_reason=stop_reason)


HELLO = (10, 1, [(10, -0.1, "Hel"), (11, -2.5, "He"), (12, -3.0, "H")])
WORLD = (20, 2, [(21, -0.4, " there"), (20, -1.2, " world"), (22, -math.inf, " masked")])


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "flat"])
def test_logprobs_chosen_token_first_then_the_top_k_by_rank_as_vllm_orders_them(flat):
    """vLLM's own order, which its server shows: the sampled token first, then the top k by rank (the sampled one
    once). With the top 2 asked for, as the engine gives them:"""
    hello = (10, 1, HELLO[2][:2])
    world = (20, 2, WORLD[2][:2])
    out = token_logprobs(_output([hello, world], flat=flat), top_k=2)
    assert [lp.token for lp in out] == ["Hel", " world"]  # the sampled token, even when it is not the top one
    assert [lp.logprob for lp in out] == [-0.1, -1.2]
    assert out[0].top == (("Hel", -0.1), ("He", -2.5))
    assert out[1].top == ((" world", -1.2), (" there", -0.4))
    sampled_outside_the_top_1 = token_logprobs(_output([world], flat=flat), top_k=1)
    assert sampled_outside_the_top_1[0].top == ((" world", -1.2), (" there", -0.4))  # k + 1: completions show both


@pytest.mark.parametrize("flat", [False, True], ids=["list-of-dicts", "flat"])
def test_logprobs_never_carry_minus_infinity(flat):
    out = token_logprobs(_output([WORLD], flat=flat), top_k=3)
    assert out[0].top[-1] == (" masked", -9999.0)
    assert all(math.isfinite(v) for lp in out for _, v in (*lp.top, (lp.token, lp.logprob)))


def test_logprobs_list_the_end_of_sequence_token_as_vllm_s_server_does():
    """The token that ended the choice has its entry (with the text vLLM decodes it to), as in `vllm serve`'s
    answers (the differential run: 8 entries for 7 tokens of text); the tokens still spell the text."""
    eos = (EOS, 1, [(EOS, -0.01, "")])
    out = token_logprobs(_output([HELLO, eos], finish_reason="stop", stop_reason=None), top_k=1)
    assert [lp.token for lp in out] == ["Hel", ""]
    by_stop_token = token_logprobs(_output([HELLO, eos], finish_reason="stop", stop_reason=EOS), top_k=1)
    assert [lp.token for lp in by_stop_token] == ["Hel", ""]


def test_logprobs_keep_the_last_token_when_a_stop_string_or_the_length_ended_it():
    by_string = token_logprobs(_output([HELLO, WORLD], finish_reason="stop", stop_reason="wor"), top_k=1)
    assert [lp.token for lp in by_string] == ["Hel", " world"]
    by_length = token_logprobs(_output([HELLO, WORLD], finish_reason="length"), top_k=1)
    assert [lp.token for lp in by_length] == ["Hel", " world"]


def test_logprobs_of_an_output_without_any():
    bare = CompletionOutput(index=0, text="x", token_ids=[5], cumulative_logprob=None, logprobs=None)
    assert token_logprobs(bare, top_k=2) == ()


# -- finish reasons ----------------------------------------------------------------------------

@pytest.mark.parametrize("vllm_reason, ours", [(None, None), ("stop", "stop"), ("length", "length"),
                                               ("repetition", "stop")])
def test_choice_delta_normal_finish_reasons(vllm_reason, ours):
    out = CompletionOutput(index=1, text="ab", token_ids=[3, 4], cumulative_logprob=None, logprobs=None,
                           finish_reason=vllm_reason, stop_reason="x" if vllm_reason == "stop" else None)
    delta = choice_delta(out, logprobs=None)
    assert (delta.index, delta.text, delta.num_tokens, delta.finish_reason, delta.logprobs) == (1, "ab", 2, ours, None)


@pytest.mark.parametrize("vllm_reason", ["abort", "error"])
def test_choice_delta_abort_and_error_are_failures_not_stop(vllm_reason):
    out = CompletionOutput(index=0, text="cut sh", token_ids=[1, 2], cumulative_logprob=None, logprobs=None,
                           finish_reason=vllm_reason)
    with pytest.raises(EngineFailed, match=f"choice 0 with finish reason '{vllm_reason}'"):
        choice_delta(out, logprobs=None)


@pytest.mark.parametrize("constraint, failure", [
    ({"choice": ("yes", "no")}, EngineRejected), ({"json_object": True}, EngineRejected), ({}, EngineFailed)])
def test_an_error_ending_a_constrained_choice_is_the_request_s_fault(constraint, failure):
    """vLLM ends a constrained choice with "error" when its grammar rejects the sampled token: every token the
    constraint allows was masked by the request's own settings (allowed_token_ids). It would fail so on any engine:
    a refusal the host names as the constraint's 400. Unconstrained, "error" stays a retryable failure."""
    out = SimpleNamespace(outputs=[CompletionOutput(index=0, text="", token_ids=[], cumulative_logprob=None,
                                                    logprobs=None, finish_reason="error")])
    params = GenerationParams(max_tokens=4, allowed_token_ids=(100, 101), **constraint)
    with pytest.raises(failure) as raised:
        step_choices(out, params, [])
    assert ("allowed_token_ids" in str(raised.value)) == (failure is EngineRejected)


def test_choice_delta_with_logprobs():
    delta = choice_delta(_output([(10, 1, HELLO[2][:1])], finish_reason="length"), logprobs=1)
    assert delta.finish_reason == "length" and delta.num_tokens == 1
    assert [(lp.token, lp.logprob, lp.top) for lp in delta.logprobs] == [("Hel", -0.1, (("Hel", -0.1),))]


# -- generate around a stand-in for AsyncLLM ---------------------------------------------------

class SamplingRequest:
    def __init__(self, outputs):
        self.outputs = outputs
        self.finished = False  # vLLM's: every choice has finished (these stand-in streams just end)


class StandInLLM:
    """What `VLLMEngine.generate` uses of `AsyncLLM`: `generate` (an async generator of request outputs),
    `abort` and `errored`."""

    def __init__(self, outputs=(), fail: BaseException | None = None, cause: BaseException | None = None,
                 errored: bool = False):
        self.outputs, self.fail, self.cause, self.errored = list(outputs), fail, cause, errored
        self.aborted: list[str] = []
        self.sampling: SamplingParams | None = None

    async def abort(self, request_id):
        self.aborted.append(request_id)

    async def generate(self, prompt, sampling, request_id, priority=0):
        self.sampling, self.priority = sampling, priority
        for choices in self.outputs:
            yield SamplingRequest(choices)
        if self.fail is not None:
            raise self.fail from self.cause


@pytest.fixture
def engine(model_config):
    engine = vllm_engine.VLLMEngine(model_config)
    yield engine
    engine._llm = None  # nothing to shut down


async def _run(engine, params=None):
    return [d async for d in engine.generate("r1", [1, 2, 3], params or GenerationParams(max_tokens=4))]


def _plain(text, tokens, finish=None, index=0):
    return CompletionOutput(index=index, text=text, token_ids=tokens, cumulative_logprob=None, logprobs=None,
                            finish_reason=finish, stop_reason="." if finish == "stop" else None)


async def test_generate_yields_one_delta_per_request_output(engine):
    engine._llm = llm = StandInLLM([[_plain("Hi", [7], index=0), _plain("Yo", [8], index=1)],
                                    [_plain(" you", [9], "length", index=0), _plain(".", [10], "stop", index=1)]])
    deltas = await _run(engine, GenerationParams(max_tokens=2, n=2, priority=3))
    assert [[(c.index, c.text, c.finish_reason) for c in d.choices] for d in deltas] == [
        [(0, "Hi", None), (1, "Yo", None)], [(0, " you", "length"), (1, ".", "stop")]]
    assert llm.sampling.n == 2 and llm.aborted == []
    assert llm.priority == 3  # the request's scheduling priority reaches the engine


class _HermesVocab:
    def get_vocab(self):
        return {"<tool_call>": 5, "</tool_call>": 6}


async def test_auto_tools_stop_strings_end_choices_here_and_the_engine_request_once_all_have(engine):
    """Beside a tool-call parser the engine is asked for no stop strings (they are matched before the parser,
    engine/vllm/tool_parsing.py): a choice that met one is left out of what the engine still makes of it, and once
    every choice has ended the engine's request is closed (vLLM aborts it) rather than left to run."""
    from app.engine.vllm.tool_parsing import parser_class

    engine._tool_parser, engine._tokenizer = parser_class("hermes"), _HermesVocab()
    engine._llm = llm = StandInLLM([[_plain("Hello E", [7], index=0), _plain("Hi", [8], index=1)],
                                    [_plain("ND more", [9], index=0), _plain(" there", [10], index=1)],
                                    [_plain(" on", [11], index=0)],
                                    [_plain(" on", [12], index=0), _plain(" END", [13], index=1)],
                                    [_plain("never read", [14], index=1)]])
    closed = []

    async def generate(*args, **kwargs):
        try:
            async for out in StandInLLM.generate(llm, *args, **kwargs):
                yield out
        except GeneratorExit:
            closed.append(True)
            raise

    llm.generate = generate
    tools = ({"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}},)
    deltas = await _run(engine, GenerationParams(max_tokens=8, n=2, stop=("END",), auto_tools=tools))
    assert not llm.sampling.stop and closed == [True]
    assert [[(c.index, c.text, c.finish_reason, c.stop_reason) for c in d.choices] for d in deltas] == [
        [(0, "Hello", None, None), (1, "", None, None)],  # the last 2 characters held back: they may start "END"
        [(0, " ", "stop", "END"), (1, "Hi the", None, None)],
        [(1, "re ", "stop", "END")]]  # the step where only choice 0 went on is not passed on
    assert [c.parsed_text for d in deltas for c in d.choices] == ["Hello E", "Hi", "ND more", " there", " END"]


async def test_generate_raises_engine_failed_for_an_aborted_choice(engine):
    engine._llm = StandInLLM([[_plain("The", [5])], [_plain(" end", [6], "abort")]])
    seen = []
    with pytest.raises(EngineFailed):
        async for delta in engine.generate("r1", [1], GenerationParams(max_tokens=8)):
            seen.append(delta)
    assert [c.text for d in seen for c in d.choices] == ["The"]  # what came before, then the failure


async def test_generate_refuses_parameters_vllm_refuses(engine):
    engine._llm = llm = StandInLLM([[_plain("x", [1], "stop")]])
    with pytest.raises(InvalidRequest) as refused:
        await _run(engine, GenerationParams(max_tokens=4, top_p=0.0))  # vLLM wants 0 < top_p <= 1
    assert refused.value.param == "top_p"  # vLLM names it: so does the 400
    assert llm.sampling is None  # refused before the engine saw it
    with pytest.raises(InvalidRequest) as refused:  # vLLM's message starts with the name: that names it too
        await _run(engine, GenerationParams(max_tokens=4, top_k=-5))
    assert refused.value.param == "top_k"


async def test_generate_dead_engine_is_engine_dead(engine):
    engine._llm = StandInLLM([[_plain("x", [1])]], fail=EngineDeadError())
    with pytest.raises(EngineDead):
        await _run(engine)


async def test_not_started_is_engine_dead(engine):
    with pytest.raises(EngineDead, match="not started"):
        await _run(engine)


@pytest.mark.parametrize("cause,errored,expected", [
    (UnicodeEncodeError("utf-8", "\udfff", 0, 1, "surrogates not allowed"), False, EngineRejected),
    (KeyError("internal"), False, RuntimeError),
    (UnicodeEncodeError("utf-8", "\udfff", 0, 1, "surrogates not allowed"), True, EngineDead),
], ids=["client-cause", "server-cause", "engine-errored"])
async def test_per_request_failure_is_not_engine_death(engine, cause, errored, expected):
    """vLLM wraps any unexpected per-request failure in EngineGenerateError ("possibly recoverable"); a
    lone surrogate in a stop string is one (msgpack cannot encode it). It was mapped to EngineDead, so one
    such request got the replica's engine declared dead and replaced; and vLLM had already registered the
    request without ever aborting it, so it counted as running forever."""
    engine._llm = llm = StandInLLM(fail=EngineGenerateError(), cause=cause, errored=errored)
    with pytest.raises((EngineRejected, EngineDead, RuntimeError)) as raised:
        await _run(engine, GenerationParams(max_tokens=2, stop=("\udfff",)))
    assert type(raised.value) is expected, raised.value
    assert llm.aborted == ([] if errored else ["r1"])  # a live engine forgets the request


def test_choice_delta_carries_what_stopped_it_as_vllm_s_stop_reason():
    eos = (EOS, 1, [(EOS, -0.01, "")])
    assert choice_delta(_output([HELLO, eos], finish_reason="stop", stop_reason=EOS), 1).stop_reason == EOS
    assert choice_delta(_output([HELLO], finish_reason="stop", stop_reason="\n"), 1).stop_reason == "\n"
    assert choice_delta(_output([HELLO], finish_reason="stop", stop_reason=None), 1).stop_reason is None
    assert choice_delta(_output([HELLO], finish_reason="length"), 1).stop_reason is None


# -- start ---------------------------------------------------------------------------------------

class _Started(Exception):
    """Stands for AsyncLLM's start: where the test has seen what it needs."""


@pytest.mark.parametrize("eager", [True, False])
def test_an_eager_cpu_engine_starts_with_nothing_left_to_compile(model_config, monkeypatch, eager):
    """enforce_eager on the CPU: the EngineCore (which inherits this environment) must not compile vLLM's logprobs
    helper on the first request asking for logprobs (a first token of 3.6 s instead of 0.35 s on a 2-core EPYC)."""
    seen: dict[str, str | None] = {}

    class StubLLM:
        @staticmethod
        def from_engine_args(*args, **kwargs):
            seen["dynamo"] = vllm_engine.os.environ.get("TORCHDYNAMO_DISABLE")
            raise _Started

    monkeypatch.setattr(vllm_engine.os, "environ", {})  # start() writes the engine's environment: not this process's
    monkeypatch.setattr(vllm_engine, "AsyncLLM", StubLLM)
    monkeypatch.setattr(vllm_engine, "plan_own_cores", lambda world_size: (CorePlan(((0,),), (1,), (0, 1), "x"), None))
    config = model_config.model_copy(update={"engine": model_config.engine.model_copy(update={"enforce_eager": eager})})
    with pytest.raises(_Started):
        vllm_engine.VLLMEngine(config).start()
    assert seen["dynamo"] == ("1" if eager else None)


def test_the_engine_core_is_spawned_with_the_plans_openmp_placement(model_config, monkeypatch):
    """On the CPU the EngineCore computes itself (no worker process: to_vllm.computes_in_process), so it must
    inherit the OpenMP placement vLLM's worker would get; this process's environment is restored after."""
    seen: dict[str, str | None] = {}

    class StubLLM:
        @staticmethod
        def from_engine_args(args, **kwargs):
            seen.update({name: vllm_engine.os.environ.get(name) for name in ("OMP_NUM_THREADS", "GOMP_CPU_AFFINITY")})
            seen["executor"] = args.distributed_executor_backend.__name__
            raise _Started

    monkeypatch.setattr(vllm_engine.os, "environ", {})
    monkeypatch.setattr(vllm_engine, "AsyncLLM", StubLLM)
    monkeypatch.setattr(vllm_engine, "plan_own_cores", lambda world_size: (CorePlan(((2,),), (3,), (2, 3), "x"), None))
    with pytest.raises(_Started):
        vllm_engine.VLLMEngine(model_config).start()
    assert seen == {"OMP_NUM_THREADS": "1", "GOMP_CPU_AFFINITY": "2", "executor": "UniProcExecutor"}
    assert "GOMP_CPU_AFFINITY" not in vllm_engine.os.environ


def test_the_plans_binding_reaches_the_spawned_workers_and_not_a_later_restart(model_config, monkeypatch):
    """Several CPU ranks: vLLM's multiprocessing executor binds its workers from VLLM_CPU_OMP_THREADS_BIND, so the
    plan's binding must be there while the EngineCore spawns; left in this process after, a restart in place would
    read it back as the operator's own setting."""
    seen: dict[str, str | None] = {}

    class StubLLM:
        @staticmethod
        def from_engine_args(args, **kwargs):
            seen["bind"] = vllm_engine.os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
            seen["omp"] = vllm_engine.os.environ.get("OMP_NUM_THREADS")
            raise _Started

    plan = CorePlan(((0,), (1,)), (2,), (0, 1, 2), "explicit", {"VLLM_CPU_OMP_THREADS_BIND": "0|1"})
    monkeypatch.setattr(vllm_engine.os, "environ", {})
    monkeypatch.setattr(vllm_engine, "AsyncLLM", StubLLM)
    monkeypatch.setattr(vllm_engine, "plan_own_cores", lambda world_size: (plan, None))
    config = model_config.model_copy(update={"engine": model_config.engine.model_copy(
        update={"tensor_parallel_size": 2})})
    with pytest.raises(_Started):
        vllm_engine.VLLMEngine(config).start()
    assert seen == {"bind": "0|1", "omp": None}  # the workers place themselves; the EngineCore does not compute
    assert "VLLM_CPU_OMP_THREADS_BIND" not in vllm_engine.os.environ
