"""Helpers that make third-party training frameworks (DeepSpeed, Megatron, ...) elastic under elastrain.

These are for scripts that elastrain's restart mode runs (torchrun-style: RANK/WORLD_SIZE from the
environment, restarted on each resize); ``elastrain run --mode auto`` does not take a script that
imports only ``elastrain.frameworks`` for a native one. ``ElasticSampler`` is re-exported here for
them: the exactly-once split of what is left of an epoch, from a position the script checkpoints.
Each submodule imports its framework lazily, so importing this package costs nothing.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastrain.runtime.data import ElasticSampler

__all__ = ["ElasticSampler"]


def __getattr__(name: str) -> Any:
    if name == "ElasticSampler":
        from elastrain.runtime.data import ElasticSampler

        return ElasticSampler
    raise AttributeError(f"module 'elastrain.frameworks' has no attribute {name!r}")
