"""The real engine, in this process (no Ray): does a continued choice answer what it would have? For each kind of
request, an undisturbed answer, then the same request continued from its first k tokens (the prompt's ids plus
those k as the prompt, the rest of `max_tokens`, the same seed), for several k, each kind with what the service
does for a continuation (`generator_draws`, app/engine/vllm/generator_resume.py; `resumed_output`,
app/engine/vllm/output_resume.py) and without it. Prints how many continuations equal the rest of the answer
token for token, and one JSON line at the end. Kinds: greedy; seeded sampled; greedy with presence and frequency
penalties; the same under a regex; a bad word whose first token comes just before the cut; a JSON schema (greedy,
to its end); tool_choice "auto" through vLLM's Hermes parser (the answer held to a call by a regex), continued with
the parser reading again what it had read (`parser_replay`, app/engine/vllm/tool_parsing.py) and without: equal
when the content and tool-call pieces after the cut are the undisturbed answer's; the same with a stop string that
ends the answer inside the call (matched before the parser, read again with it), cut also just before its end.

    flock /work/stack.lock .venv/bin/python scripts/engine_resume_probe.py [--config configs/cpu.yaml]

One vLLM engine start (about 10-25 s here); it leaves no process behind.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.config.app_config import load_config  # noqa: E402
from app.engine.interface import GenerationParams  # noqa: E402
from app.engine.vllm.engine import VLLMEngine  # noqa: E402

CUTS = (1, 8, 17, 30, 47)
TOKENS = 48
PATTERN = "x( [a-wyz]{3})+"  # a grammar started again at the cut would write a second x
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                                           "hobbies": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "hobbies"]}


CALL = (r'Sure\. <tool_call>\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{2,9}", "days": [1-7]\}\}'
        r'</tool_call>')
TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}


async def _ids(engine: VLLMEngine, name: str, prompt: list[int], params: GenerationParams) -> list[int]:
    return [i for piece in await _pieces(engine, name, prompt, params) for i in piece[1]]


def _bad_word(engine: VLLMEngine, answer: list[int]) -> tuple[str, int] | None:
    """Two tokens of `answer` that make a word vLLM's bad-words matching finds as exactly those two tokens, and
    where the first one sits (the cut goes right after it)."""
    for j in range(8, len(answer) - 2):
        word = engine.decode(answer[j:j + 2])
        if word.startswith(" ") and len(word.strip()) > 3 and engine.encode(word)[-2:] == answer[j:j + 2]:
            return word.strip(), j
    return None


async def _kind(engine: VLLMEngine, kind: str, prompt: list[int], params: GenerationParams, cuts: tuple[int, ...],
                resume: bool, whole: list[int] | None = None) -> str:
    whole = whole if whole is not None else await _ids(engine, f"{kind}-whole", prompt, params)
    same, diverged = 0, []
    for k in cuts:
        rest = replace(params, max_tokens=params.max_tokens - k,
                       generator_draws=k if resume and params.seed is not None else 0,
                       resumed_output=k if resume else 0)
        continued = await _ids(engine, f"{kind}-{k}", [*prompt, *whole[:k]], rest)
        same += continued == whole[k:]
        apart = next((i for i, (a, b) in enumerate(zip(continued, whole[k:], strict=False)) if a != b), None)
        if apart is None and len(continued) != len(whole) - k:
            apart = min(len(continued), len(whole) - k)
        diverged.append("same" if apart is None else f"token {k + apart}")
    print(f"{kind}: continuations equal to the undisturbed answer: {same} of {len(cuts)}; cut at "
          f"{', '.join(f'{k}: {d}' for k, d in zip(cuts, diverged, strict=True))}", flush=True)
    return f"{same} of {len(cuts)}"


async def probe(engine: VLLMEngine) -> dict[str, str]:
    prompt = engine.render_chat([{"role": "user", "content": "Tell me a long story about a lighthouse keeper."}])
    greedy = GenerationParams(max_tokens=TOKENS, temperature=0, ignore_eos=True)
    seeded = GenerationParams(max_tokens=TOKENS, temperature=0.8, seed=7, ignore_eos=True)
    penalties = replace(greedy, presence_penalty=1.5, frequency_penalty=1.0)
    results = {}
    pattern = replace(penalties, regex=PATTERN)
    plain = await _ids(engine, "plain", prompt, greedy)  # the greedy kind's whole answer, and the bad word's source
    for kind, params in (("greedy", greedy), ("seeded", seeded), ("penalties", penalties),
                         ("regex and penalties", pattern)):
        for resume in (True, False):
            name = f"{kind}, {'resumed' if resume else 'restarted'}"
            results[name] = await _kind(engine, name, prompt, params, CUTS, resume,
                                        whole=plain if params is greedy else None)
    found = _bad_word(engine, plain)
    if found is not None:
        word, j = found
        banned = replace(greedy, bad_words=(word,))
        answer = await _ids(engine, "bad-word-whole", prompt, banned)
        print(f"bad word {word!r} (tokens {j}-{j + 1} of the plain answer); the answer with it banned keeps token "
              f"{j}: {answer[j] == plain[j]}", flush=True)
        for resume in (True, False):
            name = f"bad word, {'resumed' if resume else 'restarted'}"
            results[name] = await _kind(engine, name, prompt, banned, (j + 1,), resume, whole=answer)
    person = engine.render_chat([{"role": "user", "content": "Invent a person: their name, age and hobbies, as JSON."}])
    schema = GenerationParams(max_tokens=160, temperature=0, json_schema=SCHEMA)
    whole = await _ids(engine, "json-whole", person, schema)
    print(f"JSON answer ({len(whole)} tokens): {engine.decode(whole)!r}", flush=True)
    cuts = tuple(k for k in (1, 5, len(whole) // 3, len(whole) // 2, len(whole) - 3) if 0 < k < len(whole))
    for resume in (True, False):
        name = f"json schema, {'resumed' if resume else 'restarted'}"
        results[name] = await _kind(engine, name, person, schema, cuts, resume, whole=whole)
    results.update(await _tool_calls(engine))
    return results


async def _pieces(engine: VLLMEngine, name: str, prompt: list[int], params: GenerationParams) -> list[tuple]:
    """Per delta: the text the parser read, its token ids, and what it answered (content; calls without their ids,
    which are new per request, but with whether one came)."""
    out = []
    async for delta in engine.generate(name, prompt, replace(params, return_token_ids=True)):
        for c in delta.choices:
            calls = tuple((d.index, d.name, d.arguments, d.id is not None) for d in c.tool_calls)
            out.append((c.parsed_text or "", tuple(c.token_ids or ()), c.text, calls, c.finish_reason, c.stop_reason))
    return out


async def _tool_calls(engine: VLLMEngine) -> dict[str, str]:
    results = {}
    for stop in ((), ('"days',)):
        results.update(await _tool_call_cuts(engine, stop))
    return results


async def _tool_call_cuts(engine: VLLMEngine, stop: tuple[str, ...]) -> dict[str, str]:
    ask = engine.render_chat([{"role": "user", "content": "What is the weather in Paris for two days?"}],
                             tools=[TOOL])
    params = GenerationParams(max_tokens=64, temperature=0, auto_tools=(TOOL,), regex=CALL, stop=stop)
    whole = await _pieces(engine, f"tools-whole-{len(stop)}", ask, params)
    print(f"tool call answer, stop {stop} ({len(whole)} pieces): {''.join(p[0] for p in whole)!r}; content "
          f"{''.join(p[2] for p in whole)!r}; calls: {[c for p in whole for c in p[3]]}; ends {whole[-1][4:]}",
          flush=True)
    results = {}
    last = (len(whole) - 1,) if stop else (len(whole) - 3,)  # with a stop string: the cut just before it ends
    cuts = tuple(k for k in (1, 4, 9, len(whole) // 2, *last) if 0 < k < len(whole))
    for resume in (True, False):
        same = 0
        for k in cuts:
            done = [i for p in whole[:k] for i in p[1]]
            rest = replace(params, max_tokens=params.max_tokens - len(done), resumed_output=len(done),
                           parser_replay=tuple((p[0], p[1]) for p in whole[:k]) if resume else ())
            continued = await _pieces(engine, f"tools-{len(stop)}-{k}-{resume}", [*ask, *done], rest)
            same += [p[2:] for p in continued] == [p[2:] for p in whole[k:]]
        name = f"tool_choice auto{' with a stop string' if stop else ''}, " \
               f"{'parser replayed' if resume else 'parser afresh'}"
        results[name] = f"{same} of {len(cuts)}"
        print(f"{name}: continuations whose content and calls equal the undisturbed answer's: {same} of {len(cuts)}",
              flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/cpu.yaml")
    args = parser.parse_args()
    model = load_config(args.config).models[0]
    model = model.model_copy(update={"engine": model.engine.model_copy(update={"tool_call_parser": "hermes"})})
    engine = VLLMEngine(model)
    engine.start()
    try:
        print(json.dumps(asyncio.run(probe(engine))))
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()
