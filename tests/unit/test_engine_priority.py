"""Priority classes inside the engine (issue 28): a `batch` tenant's requests reach vLLM with a priority after every
interactive one's, and an engine whose `scheduling_policy` is unset runs vLLM's `priority` policy exactly when a
tenant is of the batch class (else vLLM's `fcfs`), so the class orders the engine's own queue and its preemptions."""

from __future__ import annotations

import pytest

from app.config.app_config import parse_config
from app.config.common import ConfigError
from app.engine.fake import FakeEngine
from app.engine.interface import GenerationParams
from app.tenancy import BATCH_PRIORITY, Tenant, engine_priority
from tests.support.fake_stack import MAX_MODEL_LEN, chat_body, config_dict

MODEL = {"id": "m", "source": "fake"}
BATCH, INTERACTIVE = Tenant("b", batch=True), Tenant("i")


def test_a_batch_request_comes_after_every_interactive_one_whatever_its_client_asks():
    assert engine_priority(INTERACTIVE, 0) == 0  # vLLM's default: nothing changes without a batch class
    assert engine_priority(BATCH, 0) == BATCH_PRIORITY
    assert engine_priority(BATCH, -(2**63)) > engine_priority(INTERACTIVE, 2**63 - 1)
    # within a class the client's own value still orders its requests, as `vllm serve --scheduling-policy priority`
    assert engine_priority(INTERACTIVE, -5) < engine_priority(INTERACTIVE, 3)
    assert engine_priority(BATCH, -5) < engine_priority(BATCH, 3)


def policies(tenants: list[dict], **engine) -> list[str | None]:
    config = parse_config({"models": [{**MODEL, "engine": engine}], "tenants": tenants})
    return [m.engine.scheduling_policy for m in config.with_engine_policies().models]


def test_an_unset_policy_is_priority_exactly_when_a_tenant_is_batch():
    interactive = {"name": "i", "api_keys": ["k-i"]}
    batch = {"name": "b", "api_keys": ["k-b"], "priority": "batch"}
    assert policies([]) == ["fcfs"]
    assert policies([interactive]) == ["fcfs"]
    assert policies([interactive, batch]) == ["priority"]
    assert policies([interactive, batch], scheduling_policy="fcfs") == ["fcfs"]  # the operator's choice stands
    assert policies([], scheduling_policy="priority") == ["priority"]


def test_an_unknown_policy_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"models\.0\.engine\.scheduling_policy"):
        parse_config({"models": [{**MODEL, "engine": {"scheduling_policy": "lifo"}}]})


def test_vllm_is_given_the_policy():
    from app.engine.vllm.to_vllm import engine_args

    config = parse_config({"models": [MODEL], "tenants": [{"name": "b", "api_keys": ["k"], "priority": "batch"}]})
    assert engine_args(config.with_engine_policies().models[0], "float32").scheduling_policy == "priority"
    assert engine_args(config.models[0], "float32").scheduling_policy == "fcfs"  # unset outside a deployment


class RecordingEngine(FakeEngine):
    def __init__(self, **kw) -> None:
        super().__init__(**kw)
        self.priorities: list[int] = []

    def generate(self, request_id: str, prompt_token_ids: list[int], params: GenerationParams):
        self.priorities.append(params.priority)
        return super().generate(request_id, prompt_token_ids, params)


async def test_each_tenant_s_class_reaches_the_engine_with_its_request(make_stack):
    data = config_dict()
    data["tenants"] = [{"name": "chat", "api_keys": ["k-chat"]},
                       {"name": "nightly", "api_keys": ["k-nightly"], "priority": "batch"}]
    engine = RecordingEngine(max_model_len=MAX_MODEL_LEN)
    stack = make_stack(parse_config(data), engine)
    for key, asked in (("k-chat", None), ("k-nightly", None), ("k-nightly", -7)):
        body = chat_body(max_tokens=2) | ({} if asked is None else {"priority": asked})
        r = await stack.client.post("/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"})
        assert r.status_code == 200, r.text
    assert engine.priorities == [0, BATCH_PRIORITY, BATCH_PRIORITY - 7]
