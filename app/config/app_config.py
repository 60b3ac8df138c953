"""The whole file: the service's options and its models, parsed and checked at once; `load_config` turns
pydantic's errors into one message an operator can act on, naming each key's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from app.api_keys import resolve as resolve_keys
from app.config.common import ConfigError, StrictModel
from app.config.model import ModelConfig
from app.config.service import ServiceConfig


class AppConfig(StrictModel):
    """The whole file: service options and one or more models."""

    service: ServiceConfig = ServiceConfig()
    models: tuple[ModelConfig, ...] = Field(..., min_length=1, description="Served models; the first is listed first.")

    @model_validator(mode="after")
    def _unique_ids(self) -> AppConfig:
        ids = [m.id for m in self.models]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"model ids must be unique; repeated: {', '.join(dupes)}")
        return self

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def with_resolved_keys(self) -> AppConfig:
        """This config with every key (the file's and this process's environment's) as a digest in
        `service.api_keys`: what the replicas are deployed with, wherever their own environment lacks."""
        service = self.service.model_copy(update={"api_keys": resolve_keys(self.service.api_keys)})
        return self.model_copy(update={"service": service})


def _describe(err: ValidationError) -> str:
    lines = []
    for e in err.errors():
        where = ".".join(str(p) for p in e["loc"]) or "(top level)"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key; remove it or check its spelling (see docs/configuration.md)")
        else:
            lines.append(f"  {where}: {e['msg']}")
    return "\n".join(lines)


def parse_config(data: Any, origin: str = "config") -> AppConfig:
    try:
        return AppConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(f"{origin} is invalid:\n{_describe(err)}") from None


def load_config(path: str | Path) -> AppConfig:
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; see configs/ for examples") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    return parse_config(data, origin=str(path))
