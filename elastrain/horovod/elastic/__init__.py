"""``hvd.elastic``: ``run``, ``State``/``ObjectState``/``TorchState`` and ``ElasticSampler`` on elastrain.

``@hvd.elastic.run`` re-enters the training function after every reset. A reset is either a
``HostsUpdatedInterrupt`` (raised by ``state.commit()`` on every rank at once when elastrain
announces a new generation: workers added or removed) or a ``HorovodInternalError`` (a collective
failed: a peer died; the state is first restored to its last commit). Either way the worker stays
the same process: it joins the next generation, runs the reset callbacks, syncs the state and calls
the function again. A worker the new generation does not include (scale-in) leaves with
``elastrain.errors.WorkerLeft`` (exit code 0); when the coordinator never comes back it stops with
``CoordinatorGone`` (exit code 3). Any other exception is the script's own: it ends the worker.
"""

from __future__ import annotations

import functools
import logging
import sys
from collections.abc import Callable
from typing import Any, TypeVar

from elastrain.errors import CoordinatorGone, MembershipChange
from elastrain.errors import HostsUpdatedInterrupt as _AnyHostsUpdated
from elastrain.horovod import basics
from elastrain.horovod.elastic.sampler import ElasticSampler
from elastrain.horovod.elastic.state import ObjectState, State, TorchState
from elastrain.horovod.errors import HorovodInternalError

log = logging.getLogger("elastrain.horovod")
T = TypeVar("T")


def _failed_collective(exc: BaseException) -> bool:
    """A collective elastrain ran failed: Horovod's error, or elastrain's `PeerFailure`."""
    return isinstance(exc, (HorovodInternalError, MembershipChange))


def _stop_if_coordinator_gone() -> None:
    """The coordinator never came back: `CoordinatorGone` stops this worker (exit code 3), as elastrain's."""
    rt = basics.runtime()
    if not rt.coordinator_gone:
        return
    message = (
        f"elastrain: the coordinator did not come back within {rt.context.coordinator_timeout_s:.0f}s; "
        "this worker stops"
    )
    print(message, file=sys.stderr, flush=True)
    basics.shutdown()
    raise CoordinatorGone(message)


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Make ``func(state, ...)`` elastic: it is called again after every reset, with a synced state.

    As in Horovod, no collective may run between ``hvd.init()`` and this call on a worker that
    joins a running job before its state is synced (the sync is the first collective here).
    """

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        rt = basics.runtime()
        reset = False
        while True:
            try:
                if reset or not rt.group_valid:
                    basics.join_generation(rt, int(getattr(state, "_commits", -1)))
                if reset:
                    state.on_reset()
                state.sync()
                return func(state, *args, **kwargs)
            except _AnyHostsUpdated:
                if rt.rendezvous is None:
                    raise
                log.info("%s: the workers are changing; rejoining", rt.context.worker_id)
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                if rt.rendezvous is None or not _failed_collective(exc):
                    raise
                log.warning(
                    "%s: collective failed (%s); restoring the last commit and rejoining",
                    rt.context.worker_id,
                    str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__,
                )
                state.restore()
            _stop_if_coordinator_gone()
            rt.invalidate()
            reset = True

    return wrapper


__all__ = ["ElasticSampler", "ObjectState", "State", "TorchState", "run"]
