"""service.cors_allowed_origins: a browser page on an allowed origin can call the API (preflight, answer and refusal
readable); without the option, or from another origin, no CORS header is sent."""

from __future__ import annotations

import pytest

from app.api_keys import API_KEYS_ENV
from app.config.app_config import ConfigError
from tests.support.fake_stack import chat_body, make_config

APP_ORIGIN = "https://chat.example.com"
PREFLIGHT = {"Origin": APP_ORIGIN, "Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "authorization,content-type"}


@pytest.fixture
def keyed_stack(make_stack, monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    return make_stack(make_config(service={"api_keys": ["sk-right"], "cors_allowed_origins": [APP_ORIGIN]}))


async def test_a_page_on_an_allowed_origin_calls_the_api_with_its_key(keyed_stack):
    client = keyed_stack.client
    preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)  # sent without the key
    assert preflight.status_code == 200, preflight.text
    assert preflight.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "authorization" in preflight.headers["access-control-allow-headers"].lower()

    answer = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2),
                               headers={"Origin": APP_ORIGIN, "Authorization": "Bearer sk-right"})
    assert answer.status_code == 200, answer.text
    assert answer.headers["access-control-allow-origin"] == APP_ORIGIN
    assert "x-request-id" in answer.headers["access-control-expose-headers"]

    refused = await client.post("/v1/chat/completions", json=chat_body(), headers={"Origin": APP_ORIGIN})
    assert refused.status_code == 401  # the page can read why
    assert refused.headers["access-control-allow-origin"] == APP_ORIGIN


async def test_another_origin_gets_no_cors_headers(keyed_stack):
    preflight = await keyed_stack.client.options("/v1/chat/completions",
                                                 headers={**PREFLIGHT, "Origin": "https://evil.example"})
    assert preflight.status_code == 400
    assert "access-control-allow-origin" not in preflight.headers


async def test_by_default_no_cors_headers(client):
    answer = await client.post("/v1/chat/completions", json=chat_body(max_tokens=2), headers={"Origin": APP_ORIGIN})
    assert answer.status_code == 200
    assert "access-control-allow-origin" not in answer.headers
    preflight = await client.options("/v1/chat/completions", headers=PREFLIGHT)
    assert preflight.status_code == 405 and "access-control-allow-origin" not in preflight.headers


async def test_any_origin(make_stack):
    client = make_stack(make_config(service={"cors_allowed_origins": ["*"]})).client
    answer = await client.get("/v1/models", headers={"Origin": "https://anything.example"})
    assert answer.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize("origin", ["https://chat.example.com/", "chat.example.com", "https://a.example/app"])
def test_an_origin_with_a_path_or_without_a_scheme_is_refused_with_its_key(origin):
    with pytest.raises(ConfigError, match=r"service\.cors_allowed_origins.*scheme://host"):
        make_config(service={"cors_allowed_origins": [origin]})
