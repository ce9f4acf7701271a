"""DeepSpeed under elastrain's native mode: ZeRO-1/2 engines resized in place (`ElasticZero`).

``from elastrain.deepspeed import ElasticZero`` makes a script native for ``elastrain run --mode auto``
(DeepSpeed is imported only when an engine is built).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastrain.deepspeed.zero import ElasticZero, ZeroStateLost

__all__ = ["ElasticZero", "ZeroStateLost"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from elastrain.deepspeed import zero

        return getattr(zero, name)
    raise AttributeError(f"module 'elastrain.deepspeed' has no attribute {name!r}")
