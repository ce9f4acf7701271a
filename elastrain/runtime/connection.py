"""The process's connection to its job: rendezvous client, current generation, process group, ledger.

`Runtime` knows *who* this worker is in the current generation and can join the next one; it does not
drive training (that is `elastrain.runtime.cycle.GenerationCycle`). `init()` creates the process's
one `Runtime`; without `elastrain run` it is a world of one.
"""

from __future__ import annotations

import logging
import signal
import threading
import traceback

from elastrain.errors import ElastrainError, JobFailed, WorkerLeft
from elastrain.rendezvous.api import Generation, JoinOutcome, Rendezvous
from elastrain.runtime.collective import peer_failures
from elastrain.runtime.context import LaunchContext
from elastrain.runtime.group import GroupManager
from elastrain.runtime.ledger import Ledger

log = logging.getLogger("elastrain")


class Runtime:
    """Per-process elastic runtime: the rendezvous client, the current generation, the group."""

    def __init__(self, context: LaunchContext, rendezvous: Rendezvous | None) -> None:
        self.context = context
        self.rendezvous = rendezvous
        self.groups = GroupManager(
            context.backend, context.collective_timeout_s, context.local_rank, context.host, context.token
        )
        self.ledger = Ledger(context.ledger_dir, context.worker_id, context.run_id)
        self.generation: Generation | None = None
        self.rank = 0
        self.world_size = 1
        self.group_valid = not context.managed

    # ----- membership ---------------------------------------------------------------------------
    def pending(self) -> bool:
        """Local view: has the coordinator announced a new generation?"""
        return self.rendezvous is not None and self.rendezvous.pending()

    @property
    def coordinator_gone(self) -> bool:
        """True when the coordinator did not come back within its timeout."""
        return self.rendezvous is not None and self.rendezvous.coordinator_gone

    def ensure_group(self, committed_step: int) -> None:
        """Join the next generation and build its group, unless the current one is still good.

        Raises `WorkerLeft` (exit code 0) when the coordinator says this worker leaves or the job is
        over, `PeerFailure` when the group cannot be built.
        """
        if self.group_valid or self.rendezvous is None:
            return
        self.groups.destroy()
        result = self.rendezvous.join(committed_step)
        if result.outcome == JoinOutcome.LEAVE:
            log.info("%s leaves the job (%s)", self.context.worker_id, result.reason)
            self.shutdown()
            raise WorkerLeft(f"{self.context.worker_id} leaves the job ({result.reason})")
        if result.outcome == JoinOutcome.JOB_OVER or result.generation is None:
            self.shutdown()
            raise WorkerLeft(f"the job is over ({result.reason})" if result.reason else "the job is over")
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
        """One tiny collective: does any rank know of a pending generation? (`PeerFailure` if it fails)"""
        if self.world_size <= 1 and self.rendezvous is None:
            return False
        import torch
        import torch.distributed as dist

        flag = torch.tensor([1.0 if local_flag else 0.0], device=self.groups.device)
        with peer_failures("the pending-generation check"):
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item() > 0)

    # ----- ending -------------------------------------------------------------------------------
    def finish(self) -> None:
        """The training function returned on this rank: report done and release the group."""
        if self.rendezvous is not None:
            self.rendezvous.report_done()
        self.shutdown()

    def report_failure(self, exc: BaseException) -> JobFailed:
        """An ordinary exception in the user's code: report it to the coordinator once, release
        everything, and return the `JobFailed` to raise (``reported=True``)."""
        if isinstance(exc, ElastrainError):  # our own errors say what to do: no traceback
            text = f"{type(exc).__name__}: {exc}"
        else:
            text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        if self.rendezvous is not None:
            self.rendezvous.report_error(text)
        self.shutdown()
        summary = str(exc).splitlines()[0] if str(exc).strip() else ""
        return JobFailed(f"{type(exc).__name__}: {summary}" if summary else type(exc).__name__, reported=True)

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
            from elastrain.runtime.entry import install_exit_policy

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
            install_exit_policy()
            if threading.current_thread() is threading.main_thread():
                signal.signal(signal.SIGTERM, lambda *_: rendezvous.request_leave() if rendezvous else None)
        _RUNTIME = Runtime(context, rendezvous)
        return _RUNTIME


def current_runtime() -> Runtime | None:
    """The process's runtime if it has one already (never initialises it)."""
    return _RUNTIME


def get_runtime() -> Runtime:
    """The process's runtime (initialising it on first use)."""
    return _RUNTIME if _RUNTIME is not None else init()
