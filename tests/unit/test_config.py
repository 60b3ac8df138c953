"""Config loading: the shipped file loads, typos and impossible values are refused by name."""

from __future__ import annotations

import pytest
import yaml
from pydantic import ValidationError

from app.api_keys import API_KEYS_ENV, digest_of
from app.config.app_config import AppConfig, load_config, parse_config
from app.config.common import ConfigError
from tests.support.fake_stack import REPO_ROOT, config_dict


def test_cpu_yaml_loads():
    cfg = load_config(REPO_ROOT / "configs" / "cpu.yaml")
    assert isinstance(cfg, AppConfig)
    assert [m.id for m in cfg.models] == ["smollm2-135m-instruct"]
    model = cfg.models[0]
    assert model.engine.max_model_len == 2048
    assert model.limits.default_max_tokens == 256
    assert model.deployment.max_queued_requests == 64
    assert cfg.service.request_timeout_s == 300
    assert model.max_prompt_tokens == 2047  # default: max_model_len - 1
    assert not model.on_gpu


def test_missing_file_is_config_error(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")


def test_bad_yaml_is_config_error(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("models: [\n  - id: x\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(path)


def test_unknown_key_named_with_its_path(tmp_path):
    data = config_dict()
    data["models"][0]["engine"]["max_modl_len"] = 1024
    path = tmp_path / "typo.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert "models.0.engine.max_modl_len" in message
    assert "unknown key" in message
    assert str(path) in message


def test_unknown_top_level_and_service_keys():
    data = config_dict()
    data["servce"] = {}
    with pytest.raises(ConfigError, match=r"servce: unknown key"):
        parse_config(data)
    data = config_dict()
    data["service"] = {"prot": 80}
    with pytest.raises(ConfigError, match=r"service\.prot: unknown key"):
        parse_config(data)


@pytest.mark.parametrize(
    ("overrides", "where"),
    [
        ({"engine": {"max_model_len": 0}}, "models.0.engine.max_model_len"),
        ({"engine": {"kv_cache_gib": 0}}, "models.0.engine.kv_cache_gib"),
        ({"limits": {"default_max_tokens": 200, "max_tokens": 100}},
         "default_max_tokens (200) is above max_tokens (100)"),
        ({"engine": {"max_model_len": 64}, "limits": {"default_max_tokens": 64, "max_tokens": 128}},
         "default_max_tokens (64) must be below engine.max_model_len (64)"),
        ({"engine": {"max_model_len": 64}, "limits": {"max_prompt_tokens": 64, "default_max_tokens": 8}},
         "max_prompt_tokens (64) must be below"),
        ({"deployment": {"max_ongoing_requests": 0}}, "models.0.deployment.max_ongoing_requests"),
        ({"id": "has space"}, "models.0.id"),
        ({"engine_kind": "llamacpp"}, "models.0.engine_kind"),
        ({"engine": {"tensor_parallel_size": 2}}, "tensor_parallel_size > 1 needs"),
        ({"engine_kind": "vllm", "engine": {"fake_token_delay_s": 0.1}}, "fake_token_delay_s is for engine_kind: fake"),
        ({"engine": {"fake_token_delay_s": -1}}, "models.0.engine.fake_token_delay_s"),
    ],
)
def test_impossible_values_rejected(overrides, where):
    with pytest.raises(ConfigError) as info:
        parse_config(config_dict(**overrides))
    assert where in str(info.value)


def test_an_error_is_said_once_at_its_key_s_path_without_pydantic_s_wording():
    data = config_dict(deployment={"num_replicas": 2, "autoscaling": {"min_replicas": 1, "max_replicas": 2}})
    with pytest.raises(ConfigError) as info:
        parse_config(data)
    lines = str(info.value).splitlines()[1:]
    assert lines == ["  models.0.deployment: set either num_replicas or autoscaling (its min_replicas and "
                     "max_replicas), not both"]  # not also "models: ... at least 1 item", nor "Value error,"


def test_duplicate_model_ids_rejected():
    data = config_dict()
    data["models"].append(dict(data["models"][0]))
    with pytest.raises(ConfigError, match="models.1.id: 'fake-model' is already given at models.0.id"):
        parse_config(data)


def test_no_models_rejected():
    with pytest.raises(ConfigError, match="models"):
        parse_config({"models": []})
    with pytest.raises(ConfigError, match="models"):
        parse_config({})


def test_valid_fake_config_and_model_lookup():
    cfg = parse_config(config_dict())
    assert cfg.model("fake-model") is cfg.models[0]
    assert cfg.model("other") is None
    assert cfg.models[0].engine_kind == "fake"


def test_api_keys_merge_env(monkeypatch):
    data = config_dict()
    data["service"] = {"api_keys": ["from-file"]}
    cfg = parse_config(data)
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    assert cfg.with_resolved_keys().service.api_keys == (digest_of("from-file"),)
    monkeypatch.setenv(API_KEYS_ENV, " env-a ,env-b,, ")
    assert set(cfg.with_resolved_keys().service.api_keys) == {digest_of(k) for k in ("from-file", "env-a", "env-b")}


def test_no_api_keys_by_default(monkeypatch):
    monkeypatch.delenv(API_KEYS_ENV, raising=False)
    assert parse_config(config_dict()).with_resolved_keys().service.api_keys == ()


def test_config_is_frozen():
    cfg = parse_config(config_dict())
    with pytest.raises(ValidationError, match="frozen"):
        cfg.models[0].engine.max_model_len = 4096  # type: ignore[misc]
