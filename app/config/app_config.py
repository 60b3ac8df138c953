"""The whole file: the service's options and its models, parsed and checked at once; `load_config` turns
pydantic's errors into one message an operator can act on, naming each key's path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import Field, ValidationError, model_validator

from app.api_keys import as_digest
from app.api_keys import resolve as resolve_keys
from app.config.common import ConfigError, StrictModel
from app.config.model import ModelConfig
from app.config.service import ServiceConfig
from app.config.tenants import TenantConfig


class AppConfig(StrictModel):
    """The whole file: service options and one or more models."""

    service: ServiceConfig = ServiceConfig()
    models: tuple[ModelConfig, ...] = Field(..., min_length=1, description="Served models; the first is listed first.")
    tenants: tuple[TenantConfig, ...] = Field(
        (), description="Who shares the service: each tenant's keys, weight and priority (docs/tenants.md).")

    @model_validator(mode="after")
    def _unique_ids(self) -> AppConfig:
        _first_repeat("models", "id", [m.id for m in self.models], "model ids must be unique")
        return self

    @model_validator(mode="after")
    def _each_key_one_tenant(self) -> AppConfig:
        _first_repeat("tenants", "name", [t.name for t in self.tenants], "tenant names must be unique")
        owner: dict[str, str] = {}
        places = [(f"service.api_keys.{i}", k) for i, k in enumerate(self.service.api_keys)]
        places += [(f"tenants.{t}.api_keys.{i}", k) for t, tenant in enumerate(self.tenants)
                   for i, k in enumerate(tenant.api_keys)]
        for path, key in places:
            digest = as_digest(key)
            if digest in owner:
                raise ValueError(f"{path}: this key is already given at {owner[digest]}; a key belongs to exactly one "
                                 "tenant")
            owner[digest] = path
        return self

    def model(self, model_id: str) -> ModelConfig | None:
        return next((m for m in self.models if m.id == model_id), None)

    def with_resolved_keys(self) -> AppConfig:
        """This config with every key (the file's and this process's environment's) as a digest in
        `service.api_keys`: what the replicas are deployed with, wherever their own environment lacks."""
        tenant_keys = {as_digest(k) for t in self.tenants for k in t.api_keys}
        # A key of the environment that a tenant names is that tenant's, not one of its own.
        service = self.service.model_copy(
            update={"api_keys": tuple(k for k in resolve_keys(self.service.api_keys) if k not in tenant_keys)})
        tenants = tuple(t.model_copy(update={"api_keys": tuple(sorted(map(as_digest, t.api_keys)))})
                        for t in self.tenants)
        return self.model_copy(update={"service": service, "tenants": tenants})

    def with_engine_policies(self) -> AppConfig:
        """This config with each engine's unset `scheduling_policy` decided: `priority` when a tenant is of the batch
        class (interactive first in the engine as in the admission), else vLLM's `fcfs`."""
        policy = "priority" if any(t.priority == "batch" for t in self.tenants) else "fcfs"
        models = tuple(m if m.engine.scheduling_policy else m.model_copy(update={
            "engine": m.engine.model_copy(update={"scheduling_policy": policy})}) for m in self.models)
        return self.model_copy(update={"models": models})

    def on_one_machine(self) -> tuple[AppConfig, list[str]]:
        """This config for a Ray of this machine alone (`python -m app serve` without RAY_ADDRESS): a CPU model that
        autoscales runs its `min_replicas`, fixed, since a second CPU engine here would compute on the cores the
        first already claimed (engine/cpu/claims.py) and add no capacity; with one replica, it serves HTTP itself
        (no hop per token). GPU models keep autoscaling (another GPU of the machine is capacity). With a note per
        model changed."""
        models, notes = [], []
        for m in self.models:
            scaling = m.deployment.autoscaling
            if scaling is None or m.deployment.num_gpus:
                models.append(m)
                continue
            fixed = m.deployment.model_copy(update={"autoscaling": None, "num_replicas": scaling.min_replicas})
            models.append(m.model_copy(update={"deployment": fixed}))
            notes.append(f"model {m.id}: autoscaling ({scaling.min_replicas}-{scaling.max_replicas} replicas) needs "
                         f"a cluster; on this one machine a second CPU engine would share the first one's cores, "
                         f"so it runs {scaling.min_replicas} replica(s). To scale out: `python -m app cluster up` "
                         "and RAY_ADDRESS, or KubeRay (docs/autoscaling.md)")
        return self.model_copy(update={"models": tuple(models)}), notes


def _first_repeat(where: str, field: str, values: list[str], rule: str) -> None:
    """Refuse a list's first repeated value at its path, naming the first place it was given."""
    first: dict[str, int] = {}
    for i, value in enumerate(values):
        if value in first:
            raise ValueError(f"{where}.{i}.{field}: {value!r} is already given at {where}.{first[value]}.{field}; "
                             f"{rule}")
        first[value] = i


def _describe(err: ValidationError) -> str:
    errors = err.errors()
    lines = []
    for e in errors:
        loc = e["loc"]
        # pydantic also counts a list's items that failed as missing ("at least 1 item ... not 0"): only the
        # failing item's own error says anything.
        if e["type"] == "too_short" and any(len(o["loc"]) > len(loc) and o["loc"][:len(loc)] == loc for o in errors):
            continue
        where = ".".join(str(p) for p in loc)
        message = str(e["ctx"]["error"]) if e["type"] == "value_error" and "error" in e.get("ctx", {}) else e["msg"]
        if e["type"] == "too_short":  # pydantic's "Tuple should have at least 1 item after validation, not 0"
            least = e.get("ctx", {}).get("min_length", 1)
            message = f"give at least {least} item{'s' if least != 1 else ''} here"
        if e["type"] == "extra_forbidden":
            lines.append(f"  {where}: unknown key; remove it or check its spelling (see docs/configuration.md)")
        else:  # a check of the whole file names its keys' paths in its message
            lines.append(f"  {where}: {message}" if where else f"  {message}")
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
