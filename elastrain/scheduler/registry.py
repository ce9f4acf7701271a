"""Policy names for the CLI and the control plane."""

from __future__ import annotations

import enum
from collections.abc import Callable

from elastrain.errors import ConfigError
from elastrain.scheduler.api import Policy
from elastrain.scheduler.elastic import ElasticPolicy
from elastrain.scheduler.goodput import GoodputSpeed
from elastrain.scheduler.ranking import GPU_HOUR
from elastrain.scheduler.static import StaticBackfillPolicy, StaticPolicy
from elastrain.scheduler.tiresias import TiresiasPolicy


def elastic_policy(*, preemptive: bool = True) -> ElasticPolicy:
    """The ``elastic`` policy as both the simulator (``elastrain simulate --compare elastic``) and the
    control plane (``elastrain server``, its default) run it: its default ranking and thresholds, and a
    :class:`~elastrain.scheduler.goodput.GoodputSpeed` as its speed model, which is the step-time
    model or the measured samples/s (:func:`~elastrain.scheduler.throughput.job_speed`) until a
    job's reports say more (the control plane registers them; a simulated trace has none)."""
    return ElasticPolicy(speed=GoodputSpeed(), preemptive=preemptive)


class PolicyName(str, enum.Enum):
    """The policies by name (``elastrain simulate --compare``, ``elastrain server --scheduler``)."""

    STATIC = "static"
    STATIC_BACKFILL = "static-backfill"
    ELASTIC = "elastic"
    TIRESIAS = "tiresias"


POLICIES: dict[str, Callable[[], Policy]] = {
    PolicyName.STATIC.value: StaticPolicy,
    PolicyName.STATIC_BACKFILL.value: StaticBackfillPolicy,
    PolicyName.ELASTIC.value: elastic_policy,
    PolicyName.TIRESIAS.value: TiresiasPolicy,
}


def make_policy(
    name: str | PolicyName, tiresias_threshold_gpu_h: float | None = None, *, preemptive: bool = True
) -> Policy:
    """A fresh policy by name; unknown names are a :class:`ConfigError` listing the known ones.
    ``tiresias_threshold_gpu_h`` overrides Tiresias's queue threshold (default 16 GPU-hours);
    ``preemptive=False`` gives an ``elastic`` that never takes a running job below its minimum
    (for a caller that cannot suspend jobs, like today's control plane)."""
    key = name.value if isinstance(name, PolicyName) else name
    if key == PolicyName.TIRESIAS.value and tiresias_threshold_gpu_h is not None:
        return TiresiasPolicy(thresholds=(tiresias_threshold_gpu_h * GPU_HOUR,))
    if key == PolicyName.ELASTIC.value:
        return elastic_policy(preemptive=preemptive)
    try:
        return POLICIES[key]()
    except KeyError:
        raise ConfigError(f"unknown policy {key!r}; choose from {', '.join(POLICIES)}") from None
