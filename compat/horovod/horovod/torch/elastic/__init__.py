"""``horovod.torch.elastic``: elastrain's elastic API for Horovod scripts (:mod:`elastrain.horovod.elastic`).

This is not Horovod: ``run``, ``TorchState`` and ``ElasticSampler`` resize with elastrain's runtime.
"""

from __future__ import annotations

from elastrain.horovod.elastic import *  # noqa: F403
from elastrain.horovod.elastic import __all__ as _api
from elastrain.horovod.elastic.state import ObjectState, State

__all__ = [*_api, "ObjectState", "State"]
