"""A model folder that is missing or holds no model fails start-up once, naming the path, before Ray starts."""

from __future__ import annotations

import socket
import sys

import pytest
import yaml

from app.cli import main as cli
from app.engine.model_store import resolve_source
from tests.support.fake_stack import REPO_ROOT


def test_a_missing_folder_never_falls_through_to_a_hub_lookup(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        resolve_source(str(tmp_path / "nope"))
    assert resolve_source("org/model-name") == "org/model-name"  # a hub id stays one


def test_a_folder_without_weights_is_refused(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(FileNotFoundError, match="no weights"):
        resolve_source(str(tmp_path))
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert resolve_source(str(tmp_path)) == str(tmp_path.resolve())


def test_serve_with_a_missing_model_folder_stops_before_ray_naming_the_path(tmp_path, capsys, monkeypatch):
    config = yaml.safe_load((REPO_ROOT / "configs" / "cpu.yaml").read_text())
    config["models"][0]["source"] = str(tmp_path / "missing-model")
    with socket.socket() as s:  # a free port: the CLI's check binds it and lets it go
        s.bind(("127.0.0.1", 0))
        config["service"]["port"] = s.getsockname()[1]
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert cli.main(["serve", "--config", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"model folder {tmp_path / 'missing-model'} does not exist" in err
    assert "ray" not in sys.modules or not __import__("ray").is_initialized()
