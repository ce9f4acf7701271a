"""``horovod``: a shim over elastrain's implementation of the Horovod API. This is not Horovod.

Installed by the ``elastrain-horovod-compat`` distribution (the Horovod image, tests) so that
``import horovod.torch as hvd`` resolves to :mod:`elastrain.horovod` and ``horovodrun`` to
:mod:`elastrain.horovod.runner`. Only the PyTorch API exists (``horovod.torch``); TensorFlow, Keras,
MXNet, Spark and Ray are not provided. ``__version__`` is the Horovod API version it follows.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.28.1+elastrain"


def run(*args: Any, **kwargs: Any) -> Any:
    """``horovod.run`` (launching workers from Python) is not supported: use ``horovodrun``."""
    raise NotImplementedError(
        "horovod.run() is not supported by elastrain's Horovod API; launch with `horovodrun -np N ...`"
    )
