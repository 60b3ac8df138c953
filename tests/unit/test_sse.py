"""SSE framing: exact bytes, compact JSON, UTF-8 kept, and parse() as its inverse."""

from __future__ import annotations

import json

import pytest

from app.http import sse
from tests.support.sse import parse


def test_event_framing_exact_bytes():
    assert sse.event({"a": 1, "b": [1, 2], "c": None}) == b'data: {"a":1,"b":[1,2],"c":null}\n\n'


def test_event_is_compact_and_single_line():
    out = sse.event({"text": "two\nlines", "nested": {"k": "v"}})
    assert out.startswith(b"data: ") and out.endswith(b"\n\n")
    body = out[len(b"data: "):-2]
    assert b" " not in body
    assert b"\n" not in body  # a newline inside a value is escaped, never splits the event
    assert json.loads(body) == {"text": "two\nlines", "nested": {"k": "v"}}


def test_event_keeps_non_ascii():
    out = sse.event({"content": "héllo 世界 🙂"})
    assert out == 'data: {"content":"héllo 世界 🙂"}\n\n'.encode()
    assert b"\\u" not in out


def test_done_and_error_event():
    assert sse.DONE == b"data: [DONE]\n\n"
    body = {"error": {"message": "m", "type": "t", "param": None, "code": None}}
    assert sse.error_event(body) == sse.event(body)


def test_parse_round_trip():
    payloads = [{"i": 0, "s": "é"}, {"i": 1, "choices": []}, {"x": "a\n\nb"}]
    raw = b"".join(sse.event(p) for p in payloads) + sse.DONE
    assert parse(raw.decode("utf-8")) == [*payloads, "[DONE]"]


def test_parse_rejects_non_data_lines():
    with pytest.raises(AssertionError):
        parse("event: ping\n\n")


def test_media_type_and_headers():
    assert sse.MEDIA_TYPE == "text/event-stream"
    assert sse.HEADERS["Cache-Control"] == "no-cache"
