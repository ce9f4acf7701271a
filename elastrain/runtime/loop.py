"""The elastic loop: membership change or peer failure -> rejoin -> rebuild the group -> resync state.

`init()` connects to the coordinator; `run(fn)` wraps the user's training function. Inside, the
function runs until it returns (the worker reports done), a new generation is announced (every rank
stops at the same commit), or a collective fails (a peer died). On the last two the wrapper rejoins,
rebuilds the process group in the same process, broadcasts `State` from the most advanced member,
and calls the function again; it resumes from the state (``for state.epoch in range(state.epoch, N)``).
"""

from __future__ import annotations

import functools
import logging
import os
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from elastrain.errors import ElastrainError, HostsUpdatedInterrupt, MembershipChange
from elastrain.rendezvous.api import Generation, JoinOutcome, Rendezvous
from elastrain.runtime.context import LaunchContext
from elastrain.runtime.ledger import Ledger

if TYPE_CHECKING:
    from elastrain.runtime.group import GroupManager
    from elastrain.runtime.state import State

log = logging.getLogger("elastrain")
T = TypeVar("T")


class Runtime:
    """Per-process elastic runtime: the rendezvous client, the current generation, the group."""

    def __init__(self, context: LaunchContext, rendezvous: Rendezvous | None) -> None:
        from elastrain.runtime.group import GroupManager

        self.context = context
        self.rendezvous = rendezvous
        self.groups: GroupManager = GroupManager(
            context.backend, context.collective_timeout_s, context.local_rank, context.host, context.token
        )
        self.ledger = Ledger(context.ledger_dir, context.worker_id, context.run_id)
        self.generation: Generation | None = None
        self.rank = 0
        self.world_size = 1
        self.group_valid = not context.managed
        self.synced_generation: int | None = None if context.managed else 0
        self.reported_generation: int | None = None

    # ----- membership ---------------------------------------------------------------------------
    def pending(self) -> bool:
        """Local view: has the coordinator announced a new generation?"""
        return self.rendezvous is not None and self.rendezvous.pending()

    def ensure_group(self, committed_step: int) -> None:
        """Join the next generation and build its group, unless the current one is still good."""
        if self.group_valid or self.rendezvous is None:
            return
        self.groups.destroy()
        result = self.rendezvous.join(committed_step)
        if result.outcome == JoinOutcome.LEAVE:
            log.info("%s leaves the job (%s)", self.context.worker_id, result.reason)
            self.shutdown()
            sys.exit(0)
        if result.outcome == JoinOutcome.JOB_OVER or result.generation is None:
            self.shutdown()
            sys.exit(0)
        generation = result.generation
        self.generation = generation
        self.rank = generation.rank_of(self.context.worker_id)
        self.world_size = generation.world_size
        self.groups.build(generation, self.rank)
        self.group_valid = True
        self.rendezvous.current = generation

    def invalidate(self) -> None:
        """The group is no longer usable (a resize is due or a peer died)."""
        self.group_valid = False
        self.groups.destroy()

    def agree_pending(self, local_flag: bool) -> bool:
        """One tiny collective: does any rank know of a pending generation?"""
        if self.world_size <= 1 and self.rendezvous is None:
            return False
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if local_flag else 0.0], device=self.groups.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    # ----- ending -------------------------------------------------------------------------------
    def stop_if_coordinator_gone(self, state: State) -> None:
        """The coordinator never came back: rank 0 writes a durable checkpoint, every worker exits 3."""
        if self.rendezvous is None or not self.rendezvous.coordinator_gone:
            return
        state.finish_checkpoints(self)
        where = f"; checkpoint at step {state.step}" if self.context.checkpoint_dir and self.rank == 0 else ""
        print(
            f"elastrain: the coordinator did not come back within {self.context.coordinator_timeout_s:.0f}s"
            f"{where}; start `elastrain run ... --resume auto` again",
            file=sys.stderr,
            flush=True,
        )
        self.groups.destroy()
        self.ledger.close()
        sys.exit(3)

    def finish(self) -> None:
        """The training function returned on this rank: report done and release the group."""
        if self.rendezvous is not None:
            self.rendezvous.report_done()
        self.shutdown()

    def fail(self, exc: BaseException) -> None:
        """An ordinary exception in the user's code: report it once, then exit non-zero."""
        if isinstance(exc, ElastrainError):  # our own errors say what to do: no traceback
            text = f"{type(exc).__name__}: {exc}"
        else:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if self.rendezvous is None:
            raise exc
        self.rendezvous.report_error(text)
        self.shutdown()
        sys.stdout.flush()
        os._exit(1)

    def shutdown(self) -> None:
        """Release the group, the ledger and the coordinator connection."""
        self.groups.destroy()
        self.ledger.close()
        if self.rendezvous is not None:
            self.rendezvous.close()


_RUNTIME: Runtime | None = None
_LOCK = threading.Lock()


def init(context: LaunchContext | None = None) -> Runtime:
    """Connect this process to its job (idempotent). Without `elastrain run` it is a world of one."""
    global _RUNTIME
    with _LOCK:
        if _RUNTIME is not None:
            return _RUNTIME
        context = context or LaunchContext.from_env()
        rendezvous: Rendezvous | None = None
        if context.managed:
            from elastrain.rendezvous.client import CoordinatorRendezvous

            rendezvous = CoordinatorRendezvous(
                context.coordinator,
                context.token,
                context.worker_id,
                context.host,
                context.local_rank,
                heartbeat_s=context.heartbeat_s,
                coordinator_timeout_s=context.coordinator_timeout_s,
                run_id=context.run_id,
            )
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, lambda *_: rendezvous.request_leave() if rendezvous else None)
        _RUNTIME = Runtime(context, rendezvous)
        return _RUNTIME


def get_runtime() -> Runtime:
    """The process's runtime (initialising it on first use)."""
    return _RUNTIME if _RUNTIME is not None else init()


def rank() -> int:
    """This worker's rank in the current generation (joins the first generation if needed)."""
    rt = get_runtime()
    rt.ensure_group(-1)
    return rt.rank


def world_size() -> int:
    """Number of workers in the current generation (joins the first generation if needed)."""
    rt = get_runtime()
    rt.ensure_group(-1)
    return rt.world_size


def run(func: Callable[..., T]) -> Callable[..., T]:
    """Make `func(state, ...)` elastic: it is re-entered after every membership change."""

    @functools.wraps(func)
    def wrapper(state: State, *args: Any, **kwargs: Any) -> T:
        from elastrain.runtime.group import is_collective_failure

        rt = get_runtime()
        while True:
            try:
                rt.ensure_group(state.step)
                state.sync(rt)
                result = func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                rt.stop_if_coordinator_gone(state)
                rt.invalidate()
                state.rollback()
                continue
            except (SystemExit, KeyboardInterrupt):
                raise
            except BaseException as exc:
                if isinstance(exc, MembershipChange) or (
                    rt.rendezvous is not None and is_collective_failure(exc)
                ):
                    log.warning(
                        "%s: collective failed (%s); rejoining",
                        rt.context.worker_id,
                        str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__,
                    )
                    state.rollback()
                    rt.stop_if_coordinator_gone(state)
                    rt.invalidate()
                    continue
                if isinstance(exc, ElastrainError) and rt.rendezvous is None:
                    raise
                rt.fail(exc)
                raise
            state.finish_checkpoints(rt)
            rt.finish()
            return result

    return wrapper
