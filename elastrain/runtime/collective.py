"""Failures of the collectives elastrain issues become `PeerFailure`; nothing else does.

Every collective the runtime itself runs (the gradient all-reduce, the pending-generation flag, the
state broadcast, building the group) runs inside `peer_failures`. A failure there means a peer died
or the group was torn down: it is re-raised as `elastrain.errors.PeerFailure`, chained from the
backend's error, and the elastic loop rejoins. Exceptions raised by the user's code are never matched
against words like "timeout": they pass through unchanged and fail the job.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from elastrain.errors import PeerFailure


def describe(exc: BaseException) -> str:
    """The first line of `exc`'s message (at most 120 characters), or its type's name."""
    text = str(exc)
    return text.splitlines()[0][:120] if text.strip() else type(exc).__name__


@contextmanager
def peer_failures(what: str) -> Iterator[None]:
    """Run an elastrain collective: a `RuntimeError` (torch's `DistError`s included) -> `PeerFailure`."""
    try:
        yield
    except PeerFailure:
        raise
    except RuntimeError as exc:
        raise PeerFailure(f"{what} failed: {describe(exc)}") from exc
