"""Every request body is depth-bounded before anything walks it recursively.

A client's JSON may nest as deep as Python's parser allows (about 1,000 levels); what then walks it
recursively (a size check's `json.dumps`, a chat template, Ray's pickling on its way to a replica, at
about 450 levels) fails with a `RecursionError`: a 500. `BoundedBody`, the base of every request model,
refuses a body nested deeper than `MAX_DEPTH` with a 400 naming its top-level field, walking it once
without recursion and visiting containers only. A body too deep for the parser itself is named by
`too_deep_text`, on that error path only (a scan of the raw text).
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, model_validator

from app.errors import InvalidRequest

# Far above what real requests nest (a JSON schema 40 objects deep still fits); far below what breaks.
MAX_DEPTH = 100


def too_deep(body: Any, limit: int = MAX_DEPTH) -> str | None:
    """The top-level field under which `body` nests deeper than `limit` levels, or None."""
    pending: list[tuple[Any, int, str]] = [(body, 1, "")]
    while pending:
        node, depth, field = pending.pop()
        if depth > limit:
            return field or "body"
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for key, value in items:
            if isinstance(value, (dict, list)):
                pending.append((value, depth + 1, field or str(key)))
    return None


_STRUCTURE = re.compile(rb'[\\"{}\[\]:,]')


def too_deep_text(body: bytes, limit: int = MAX_DEPTH) -> str | None:
    """As `too_deep`, over a JSON text that may be too deep to parse (strings and escapes skipped)."""
    depth, in_string, escaped, string_start = 0, False, -1, 0
    last_string, field = "", ""
    for match in _STRUCTURE.finditer(body):
        ch, at = match.group(), match.start()
        if in_string:
            if ch == b"\\" and escaped != at - 1:
                escaped = at
            elif ch == b'"' and escaped != at - 1:
                in_string = False
                last_string = body[string_start:at].decode("utf-8", "replace")
            continue
        if ch == b'"':
            in_string, string_start = True, at + 1
        elif ch == b":" and depth == 1:
            field = last_string
        elif ch in (b"{", b"["):
            depth += 1
            if depth > limit:
                return field or "body"
        elif ch in (b"}", b"]"):
            depth -= 1
    return None


class BoundedBody(BaseModel):
    """A request model whose raw body is refused when nested deeper than `MAX_DEPTH` (module docstring)."""

    @model_validator(mode="before")
    @classmethod
    def _refuse_deep(cls, data: Any) -> Any:
        if isinstance(data, (dict, list)) and (field := too_deep(data)) is not None:
            raise InvalidRequest(f"'{field}' is nested more than {MAX_DEPTH} levels deep; send a flatter structure",
                                 param=field)
        return data
