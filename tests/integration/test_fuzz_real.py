"""Fuzzing the real stack (Ray Serve + vLLM on the CPU) over HTTP, bounded to about a minute.

1. schemathesis, from the service's own /openapi.json: the generation endpoints (chat, completions, Responses),
   the token endpoints and the model list, schema-valid and schema-violating requests, generation kept short
   (max_tokens and max_output_tokens capped at 8, no streams). No 5xx, the documented content type, OpenAI-shaped
   4xx.
2. The hand-written hostile list (tests/support/hostile.py), once each.

After each of them the engines are idle (nothing running, nothing admitted), /health is 200 and a
normal chat request answers. The tests that break or stop a stack (test_faults.py, test_shutdown.py)
start their own, so these need no place in the order.
"""

from __future__ import annotations

import time
from collections import Counter

import httpx
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import content_type_conformance

from tests.support.error_shape import assert_error_shape
from tests.support.fuzzing import declared_fields, say
from tests.support.hostile import body_chunks, check_outcome, hostile_cases, stream_is_clean
from tests.support.service import MODEL

pytestmark = [pytest.mark.integration, pytest.mark.stack("shared")]

OPERATIONS = [  # (method, path, positive examples, negative examples): 70 cases at most
    ("POST", "/v1/chat/completions", 13, 5),
    ("POST", "/v1/completions", 13, 5),
    ("POST", "/v1/responses", 8, 4),
    ("POST", "/tokenize", 6, 4),
    ("POST", "/detokenize", 6, 4),
    ("GET", "/v1/models", 2, 0),
]
MAX_FUZZ_TOKENS = 8
# Each generation route's names for the output's bound: each capped, the last set when none is sent.
OUTPUT_BOUNDS = {
    "/v1/chat/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/completions": ("max_completion_tokens", "max_tokens"),
    "/v1/responses": ("max_output_tokens",),
}
REQUEST_TIMEOUT_S = 120


def openai_error_shape(ctx, response, case) -> None:
    status = response.status_code
    assert status != 422, f"422 (FastAPI's own shape) instead of a 400: {response.text[:300]}"
    if 400 <= status < 500:
        assert_error_shape(status, response.headers.get("content-type", ""), response.content)


CHECKS = [not_a_server_error, content_type_conformance, openai_error_shape]


def _keep_it_short(case, aimed: bool, declared: dict[str, set[str]]) -> None:
    """With few cases to spend, aim the schema-valid ones at the engine: the served model and only the
    declared fields (random names and unknown fields are refused long before it; the in-process fuzz
    covers those). And keep generation cheap on the CPU: the output's bound capped (and set when absent), no
    streams, no ignore_eos."""
    if not isinstance(case.body, dict):
        return
    if aimed and "model" in case.body:
        case.body["model"] = MODEL
        for name in [k for k in case.body if k not in declared.get(case.path, case.body.keys())]:
            del case.body[name]
    bounds = OUTPUT_BOUNDS.get(case.path)
    if bounds is not None:
        for name in bounds:
            value = case.body.get(name)
            # 1e11 is an int too
            if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_FUZZ_TOKENS:
                case.body[name] = MAX_FUZZ_TOKENS
        if not any(name in case.body for name in bounds):
            case.body[bounds[-1]] = MAX_FUZZ_TOKENS
        case.body.pop("stream", None)
        case.body.pop("stream_options", None)
        case.body.pop("ignore_eos", None)


def assert_idle_and_answering(service) -> None:
    """After a run of cases: nothing running or admitted, healthy, and a normal chat request answers."""
    stats = service.wait_idle()
    assert stats["engine"]["running"] == 0 and stats["admission"]["in_system"] == 0, stats
    assert stats["healthy"], stats
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=REQUEST_TIMEOUT_S) as http:
        health = http.get("/health")
        assert health.status_code == 200, health.text
        r = http.post("/v1/chat/completions", json={
            "model": MODEL, "messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8, "temperature": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["content"]


def _fuzz(service, session, operation, mode: GenerationMode, examples: int, declared: dict[str, set[str]],
          seen: Counter) -> None:
    """`examples` cases of `operation` in `mode`, each checked; their statuses counted in `seen`."""

    @settings(max_examples=examples, derandomize=True, deadline=None, database=None,
              suppress_health_check=list(HealthCheck), print_blob=True)
    @given(case=operation.as_strategy(mode))
    def fuzz(case):
        _keep_it_short(case, mode is GenerationMode.POSITIVE, declared)
        response = case.call(base_url=service.base_url, session=session, timeout=REQUEST_TIMEOUT_S)
        seen[response.status_code] += 1
        case.validate_response(response, checks=CHECKS)

    fuzz()


def test_schema_fuzz_real_stack(service, request):
    schema = schemathesis.openapi.from_url(f"{service.base_url}/openapi.json", headers=service.headers, timeout=30)
    declared = declared_fields(schema.raw_schema)
    session = requests.Session()
    session.headers.update(service.headers)
    tally: dict[str, Counter] = {}
    started = time.monotonic()
    for method, path, positive, negative in OPERATIONS:
        operation = schema[path][method]
        for mode, examples in ((GenerationMode.POSITIVE, positive), (GenerationMode.NEGATIVE, negative)):
            if not examples:
                continue
            seen = tally.setdefault(f"{method} {path} {mode.value}", Counter())
            _fuzz(service, session, operation, mode, examples, declared, seen)
    total = sum(sum(c.values()) for c in tally.values())
    say(request, f"real-stack schema fuzz: {total} cases in {time.monotonic() - started:.1f} s",
        *(f"  {label:40s} {dict(sorted(statuses.items()))}" for label, statuses in tally.items()))
    assert 0 < total <= 72
    assert any(200 in c for c in tally.values()) and any(400 in c for c in tally.values()), tally
    assert_idle_and_answering(service)


def test_hostile_list_real_stack(service, request):
    cases = [c for c in hostile_cases(MODEL) if c.over_http]
    outcomes: Counter = Counter()
    failures: list[str] = []
    started = time.monotonic()
    with httpx.Client(base_url=service.base_url, headers=service.headers, timeout=REQUEST_TIMEOUT_S) as http:
        for case in cases:
            headers = {"content-type": "application/json", **case.headers}
            content = body_chunks(case.body) if case.chunked else case.body
            try:
                response = http.post(case.path, content=content, headers=headers)
            except httpx.RemoteProtocolError as err:
                # Only a request the HTTP server itself may refuse (a 64 KiB header) may end without a response.
                outcomes["no response"] += 1
                if not case.server_level:
                    failures.append(f"{case.name}: connection dropped: {err}")
                continue
            outcomes[response.status_code] += 1
            try:
                check_outcome(case, response.status_code, response.headers.get("content-type", ""), response.content)
                stream_is_clean(case, response.headers.get("content-type", ""), response.text)
            except AssertionError as err:
                failures.append(str(err).splitlines()[0])
    say(request, f"real-stack hostile list: {len(cases)} cases in {time.monotonic() - started:.1f} s, "
                 f"statuses {dict(outcomes)}")
    assert not failures, "\n".join(failures)
    assert_idle_and_answering(service)
