"""Two models from one config, each in its own engine deployment, routed by `model`."""

from __future__ import annotations

import openai
import pytest

from tests.integration.conftest import MODEL, SECOND_MODEL

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_both_models_are_listed(client):
    assert [m.id for m in client.models.list().data] == [MODEL, SECOND_MODEL]
    assert client.models.retrieve(SECOND_MODEL).model_extra["max_model_len"] == 1024


def test_requests_are_routed_by_model_with_each_models_limits(service, client):
    before = {m: service.stats(m)["engine"]["prompt_tokens_total"] for m in (MODEL, SECOND_MODEL)}
    r = client.chat.completions.create(model=SECOND_MODEL, messages=QUESTION, temperature=0)
    assert r.model == SECOND_MODEL
    assert r.usage.completion_tokens <= 8  # the second model's default_max_tokens
    assert "Paris" in r.choices[0].message.content
    after = {m: service.stats(m)["engine"]["prompt_tokens_total"] for m in (MODEL, SECOND_MODEL)}
    assert after[SECOND_MODEL] > before[SECOND_MODEL] and after[MODEL] == before[MODEL]  # only its engine worked

    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=SECOND_MODEL, messages=QUESTION, max_tokens=20)
    assert err.value.body["param"] == "max_tokens" and "at most 16" in err.value.body["message"]
    assert client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=20, temperature=0).usage.completion_tokens <= 20
