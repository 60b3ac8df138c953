"""vLLM's outputs into neutral deltas: each completion's new text and token ids, its logprobs and the prompt's,
its finish, and the tool calls a parser found."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from app.engine.interface import (
    ChoiceDelta,
    EngineFailed,
    EngineRejected,
    GenerationParams,
    PromptTokenLogprob,
    TokenLogprob,
)
from app.engine.vllm.refusals import constrained
from app.engine.vllm.tool_parsing import AutoToolCalls

# vLLM's finish reasons that end a choice normally; "repetition" (a detected repetitive pattern) ends
# it as OpenAI's "stop" would. "abort" and "error" mean the answer was cut short: EngineFailed.
NORMAL_FINISH = {None: None, "stop": "stop", "length": "length", "repetition": "stop"}
# vLLM ends a constrained choice with "error" when the grammar rejects the token sampled: the request's own settings
# masked every token the grammar allowed. The same request fails the same way on any engine: a 400, not a 503.
NO_TOKEN_LEFT = ("the engine found no token the constraint allows among those this request's other settings leave "
                 "(allowed_token_ids, bad_words); allow tokens the constraint can use, or drop one of the two")


def prompt_token_logprobs(out: Any, as_ids: bool) -> tuple[tuple[PromptTokenLogprob, ...] | None, ...] | None:
    """vLLM's prompt logprobs of a RequestOutput (with prompt_logprobs), each position's own token first, then
    its alternatives by rank; -inf clamped as vLLM's server clamps it (-9999.0). `as_ids`: each is also named
    "token_id:<id>" for echoed logprobs; vLLM's own `prompt_logprobs` field keeps the decoded text."""
    found = getattr(out, "prompt_logprobs", None)
    if found is None:
        return None
    positions: list[tuple[PromptTokenLogprob, ...] | None] = []
    for token_id, alternatives in zip(out.prompt_token_ids or (), found, strict=False):
        if alternatives is None:
            positions.append(None)
            continue
        ranked = sorted(alternatives.items(), key=lambda item: (item[0] != token_id, item[1].rank or 0))
        positions.append(tuple(
            PromptTokenLogprob(tid, max(lp.logprob, -9999.0), lp.rank, lp.decoded_token or "",
                               token_name(tid, lp, True) if as_ids else "")
            for tid, lp in ranked
        ))
    return tuple(positions)


def finite(logprob: float) -> float:
    """A masked token's logprob is -inf, which strict JSON cannot carry; vLLM's own server clamps it the same way.
    NaN (a broken step) is clamped too: the encoder refuses it, and one odd number must not fail the request."""
    return logprob if logprob >= -9999.0 else -9999.0  # NaN compares false: clamped


def token_name(token_id: int, logprob: Any, as_id: bool) -> str:
    """How logprobs name a token: its text, or vLLM's "token_id:<id>" (return_tokens_as_token_ids)."""
    return f"token_id:{token_id}" if as_id else logprob.decoded_token or ""


def token_logprobs(completion: Any, top_k: int, as_ids: bool = False) -> tuple[TokenLogprob, ...]:
    """Every generated token's logprob, the one that ended the choice (end-of-sequence, a stop token id) included,
    as vLLM's server lists it (with its own text, `<|im_end|>`, though the answer's text leaves it out).
    Alternatives in vLLM's own order (the chosen token first, then the top ones by rank), at most `top_k` + 1 of
    them: completions show them all (OpenAI's legacy shape: the chosen token and `logprobs` others), chat its first
    `top_logprobs` (responses.ChatShape), as vLLM's server does."""
    out = []
    for token_id, alternatives in zip(completion.token_ids, completion.logprobs or (), strict=False):
        chosen = alternatives[token_id]
        listed = list(alternatives.items())[: top_k + 1]
        out.append(
            TokenLogprob(
                token=token_name(token_id, chosen, as_ids),
                logprob=finite(chosen.logprob),
                top=tuple((token_name(tid, lp, as_ids), finite(lp.logprob)) for tid, lp in listed),
                text=chosen.decoded_token if as_ids else None,
            )
        )
    return tuple(out)


def choice_delta(completion: Any, logprobs: int | None, as_ids: bool = False) -> ChoiceDelta:
    """One choice of a vLLM `RequestOutput` (a delta: `RequestOutputKind.DELTA`) in the neutral shape."""
    reason = completion.finish_reason
    if reason not in NORMAL_FINISH:
        raise EngineFailed(f"the engine ended choice {completion.index} with finish reason '{reason}'")
    return ChoiceDelta(
        index=completion.index,
        text=completion.text,
        num_tokens=len(completion.token_ids),
        finish_reason=NORMAL_FINISH[reason],
        logprobs=token_logprobs(completion, logprobs, as_ids) if logprobs is not None else None,
        stop_reason=completion.stop_reason if reason == "stop" else None,
    )


def step_choices(out: Any, params: GenerationParams, parsers: list[AutoToolCalls]) -> tuple[ChoiceDelta, ...]:
    """A vLLM `RequestOutput`'s choices in the neutral shape: with tool_choice "auto", as the parsers read them,
    less any choice already ended on a stop string there (the engine, not asked to stop on them, may run it on)."""
    choices = []
    for c in out.outputs:
        if parsers and parsers[c.index].ended:
            continue
        if c.finish_reason == "error" and constrained(params):
            raise EngineRejected(NO_TOKEN_LEFT)
        d = choice_delta(c, params.logprobs, params.tokens_as_ids)
        if parsers:
            d = parsers[c.index].read(d, list(c.token_ids))
        choices.append(replace(d, token_ids=tuple(c.token_ids)) if params.return_token_ids else d)
    return tuple(choices)
