"""What every part of the configuration shares: models that refuse unknown keys, the error an operator acts on, and the
few rules the service applies to configured values."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

DEFAULT_MODEL_SOURCE = "default"


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


class ConfigError(ValueError):
    """The configuration cannot be used; the message says what to change."""


class StrictModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def tightest(*values: float | None) -> float | None:
    """The smallest of the targets given; None if none is."""
    given = [v for v in values if v is not None]
    return min(given) if given else None
