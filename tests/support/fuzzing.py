"""What the in-process fuzz (tests/unit/test_fuzz_schema.py) and the real-stack fuzz
(tests/integration/test_fuzz_real.py) share: the declared request fields, and a report line past
pytest's output capture."""

from __future__ import annotations

from typing import Any

import pytest


def declared_fields(openapi: dict[str, Any]) -> dict[str, set[str]]:
    """path -> the properties its JSON request body declares."""
    out = {}
    for path, methods in openapi["paths"].items():
        body = methods.get("post", {}).get("requestBody", {}).get("content", {}).get("application/json", {})
        ref = body.get("schema", {}).get("$ref")
        if ref:
            out[path] = set(openapi["components"]["schemas"][ref.rsplit("/", 1)[1]].get("properties", {}))
    return out


def say(request: pytest.FixtureRequest, *lines: str) -> None:
    """Straight to the terminal, past output capture: case counts belong in every run's output."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        print("\n".join(lines))
        return
    with capture.global_and_fixture_disabled():
        for line in lines:
            reporter.write_line(line)
