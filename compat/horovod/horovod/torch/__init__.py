"""``horovod.torch``: elastrain's implementation of Horovod's PyTorch API (:mod:`elastrain.horovod`).

This is not Horovod; see :mod:`elastrain.horovod` for how it maps onto elastrain and where it differs.
"""

from __future__ import annotations

from elastrain.horovod import *  # noqa: F403
from elastrain.horovod import __all__ as _api

from . import elastic

__all__ = [*_api, "elastic"]
