"""vLLM's refusals of a request, as the seam's errors: a parameter vLLM names becomes an `InvalidRequest` naming it,
a grammar it cannot compile an `EngineRejected`."""

from __future__ import annotations

from app.engine.interface import (
    EngineRejected,
    GenerationParams,
)
from app.errors import InvalidRequest

# The request parameters vLLM may name in a VLLMValidationError (or begin its message with) that are this
# service's parameters by the same name: such a refusal is a 400 naming it. Others (a schema vLLM cannot
# compile, ...) stay EngineRejected, which the host attributes.
NAMED_PARAMETERS = (
    "logit_bias",
    "allowed_token_ids",
    "bad_words",
    "stop_token_ids",
    "min_tokens",
    "top_k",
    "min_p",
    "repetition_penalty",
    "temperature",
    "top_p",
    "max_tokens",
    "presence_penalty",
    "frequency_penalty",
    "seed",
    "stop",
    "logprob_token_ids",
)


def refusal(err: Exception, params: GenerationParams | None = None) -> Exception:
    """vLLM's refusal of a request as an error for the client: `InvalidRequest` naming the parameter when vLLM
    names one of ours (`VLLMValidationError.parameter`, or the first word of its message, as in "min_tokens must
    be less than or equal to max_tokens=..."), `EngineRejected` otherwise."""
    message = str(err)
    param = getattr(err, "parameter", None)
    if param not in NAMED_PARAMETERS:
        first = message.split(" ", 1)[0]
        param = first if first in NAMED_PARAMETERS else None
    if param is None and "out of vocabulary" in message:  # the prompt's ids, checked as the request is added
        return InvalidRequest(message, param="prompt")
    if param is None:
        return rejected(message, params)
    return InvalidRequest(message, param=param)


def constrained(p: GenerationParams) -> bool:
    return p.json_schema is not None or p.json_object or p.regex is not None or p.choice is not None or (
        p.grammar is not None)


def rejected(message: str, params: GenerationParams | None) -> Exception:
    """A refusal vLLM did not attribute. A schema that forces tool calls is the `tools`' fault, which only the
    parameters know (the host would name `response_format`); anything else stays `EngineRejected`."""
    if params is not None and constrained(params) and params.json_schema_param != "response_format":
        return InvalidRequest(f"the engine could not use this constraint: {message}", param=params.json_schema_param)
    return EngineRejected(message)
