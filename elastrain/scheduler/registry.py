"""Policy names for the CLI and the control plane."""

from __future__ import annotations

from collections.abc import Callable

from elastrain.errors import ConfigError
from elastrain.scheduler.api import Policy
from elastrain.scheduler.elastic import ElasticPolicy
from elastrain.scheduler.static import StaticPolicy
from elastrain.scheduler.tiresias import TiresiasPolicy

POLICIES: dict[str, Callable[[], Policy]] = {
    "static": StaticPolicy,
    "elastic": ElasticPolicy,
    "tiresias": TiresiasPolicy,
}


def make_policy(name: str) -> Policy:
    """A fresh policy by name; unknown names are a :class:`ConfigError` listing the known ones."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise ConfigError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)}") from None
