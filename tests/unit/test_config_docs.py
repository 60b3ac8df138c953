"""docs/configuration.md is generated from app/config/ and cannot drift from it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from pydantic import BaseModel

import app.config.app_config
import app.config.model
import app.config.service
import app.config.tenants
from scripts import gen_config_docs  # the script as a module: scripts/ is a namespace package under the repo root

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gen_config_docs.py"
DOC = REPO / "docs" / "configuration.md"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=120)


def test_configuration_doc_is_current():
    result = _run("--check")
    assert result.returncode == 0, (
        "docs/configuration.md is stale: run `python scripts/gen_config_docs.py` and commit it\n"
        + result.stdout + result.stderr
    )


def test_check_notices_a_stale_doc(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text(DOC.read_text().replace("| `max_model_len` |", "| `max_model_length` |"))
    result = _run("--check", "--output", str(stale))
    assert result.returncode == 1
    assert "stale" in result.stderr and "max_model_length" in result.stdout
    assert _run("--check", "--output", str(tmp_path / "missing.md")).returncode == 1


def test_every_config_model_and_key_is_documented():
    modules = (app.config.app_config, app.config.model, app.config.service, app.config.tenants)
    models = {obj for module in modules for obj in vars(module).values()
              if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == module.__name__
              and obj.model_fields}
    documented = {model for _, model in gen_config_docs.SECTIONS}
    assert models <= documented, \
        f"config sections missing from scripts/gen_config_docs.py SECTIONS: {models - documented}"
    text = DOC.read_text()
    for heading, model in gen_config_docs.SECTIONS:
        title = f"## `{heading}`\n" if heading != "Top level" else "## Top level\n"
        section = text.split(title, 1)[1].split("\n## ", 1)[0]
        for key, field in model.model_fields.items():
            assert f"| `{key}` |" in section, f"{heading}.{key} is not in docs/configuration.md"
            if field.description:
                assert gen_config_docs._cell(field.description) in section
