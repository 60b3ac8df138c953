"""A request body that failed its model's validation, as the 400's message and `param`.

The message is worded as vLLM 0.32's server words it (vllm/entrypoints/serve/exception_handling/handlers/
validation.py): "1 validation error:" and each of pydantic's errors as it reports it, so that the message names
the constraint (`less_than_equal`, its bound under `ctx`) a client of `vllm serve` may look for; bounded as vLLM
bounds it (at most 10 errors, each input summarized, each error cut at 1,000 characters). `param` stays this
service's own naming: the top-level field the first error is about.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from app.errors import InvalidRequest

MAX_REPORTED_ERRORS = 10
MAX_INPUT_CHARS = 200
MAX_ERROR_CHARS = 1000

# pydantic-core's names for a union's branches and its validator wrappers, which a location lists between the real
# field names (vLLM drops the same ones).
_BRACKETED = re.compile(r"[\[\]{}()]")
_MARKERS = frozenset({
    "function-wrap", "function-after", "function-before", "function-plain", "json-or-python", "lax-or-strict",
    "chain", "default", "nullable", "tagged-union", "union", "call", "arguments", "is-instance", "is-subclass",
    "callable", "str", "int", "float", "bool", "bytes", "bytearray", "list", "tuple", "dict", "set", "frozenset",
    "complex", "none", "nonetype",
})


def location(loc: Sequence[Any]) -> str:
    """A location as a dotted path of the names a client knows (`body.prompt`, not `body.prompt.list[str]`)."""
    parts = [str(p) for p in loc if not (_BRACKETED.search(str(p)) or str(p).lower() in _MARKERS)]
    return ".".join(parts or [str(p) for p in loc])


def _summary(value: object) -> object:
    """An error's `input`, bounded: a body can be as large as the service takes, and every error repeats it."""
    if isinstance(value, str):
        return value if len(value) <= MAX_INPUT_CHARS else value[:MAX_INPUT_CHARS] + "...[truncated]"
    if isinstance(value, (bytes, bytearray)):
        return f"<{type(value).__name__} of {len(value)} bytes>"
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"<{type(value).__name__} of {len(value)} items>"
    try:
        text = str(value)
    except ValueError:  # an int past Python's digit limit for str()
        return f"<{type(value).__name__}>"
    return text if len(text) <= MAX_INPUT_CHARS else text[:MAX_INPUT_CHARS] + "...[truncated]"


def _described(error: object) -> str:
    if isinstance(error, dict):
        error = dict(error)
        if "input" in error:
            error["input"] = _summary(error["input"])
        if isinstance(error.get("loc"), (tuple, list)):
            error["loc"] = location(error["loc"])
    text = str(error)
    return text if len(text) <= MAX_ERROR_CHARS else text[:MAX_ERROR_CHARS] + "...[truncated]"


def message(errors: Sequence[Any]) -> str:
    if not errors:
        return "Validation error"
    label = "error" if len(errors) == 1 else "errors"
    shown = errors[:MAX_REPORTED_ERRORS]
    text = f"{len(errors)} validation {label}:\n" + "".join(f"  {_described(e)}\n" for e in shown)
    if len(errors) > len(shown):
        text += f"  ...and {len(errors) - len(shown)} more {label}\n"
    return text.rstrip()


def param(errors: Sequence[Any]) -> str | None:
    """The top-level field of the first error (`seed` where vLLM says `body.seed`)."""
    first = errors[0] if errors and isinstance(errors[0], dict) else {}
    loc = [str(p) for p in first.get("loc", ()) if p != "body"]
    return loc[0] if loc else None


def refused_as_built(errors: Sequence[Any], default_param: str,
                     named: Callable[[str], str | None] = lambda field: field) -> InvalidRequest:
    """The 400 for a request this service built from another's fields (a chat request from a Responses or /tokenize
    body): pydantic's words for the first error, naming its top-level field as `named` calls it in the client's
    request (`default_param` where the error has no field)."""
    field = named(param(errors) or default_param)
    return InvalidRequest(f"Invalid '{field}': {errors[0]['msg']}", param=field)
