"""What the coordinator keeps: its configuration, one record per worker, and how the job ended."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastrain.rendezvous.api import WorkerState
from elastrain.rendezvous.messages import Join, Rejoin

LIVE = (
    WorkerState.STARTING,
    WorkerState.WAITING,
    WorkerState.ACTIVE,
    WorkerState.STOPPED,
    WorkerState.LEAVING,
)
MEMBER = (WorkerState.ACTIVE, WorkerState.STOPPED, WorkerState.LEAVING)


@dataclass
class CoordinatorConfig:
    """Sizes and time bounds of one job."""

    min_np: int
    max_np: int
    initial_np: int
    join_grace_s: float = 5.0  # wait this long for more starting workers before admitting the ready ones
    start_timeout_s: float = 120.0  # give up if min_np workers are not ready by then
    elastic_timeout_s: float = 60.0  # give up if below min_np this long
    heartbeat_timeout_s: float = 30.0
    max_restarts: int = 3  # respawns allowed to get back to min_np after failures
    events_path: Path | None = None
    adopt: bool = False  # a restarted coordinator: adopt the agents and workers that reconnect
    adopt_grace_s: float = 5.0
    run_id: str = ""
    # limits on the coordinator's connections (0: sized from max_np; see `wire` and `connection_limits`)
    max_connections: int = 0
    max_unauthenticated: int = 0
    hello_timeout_s: float = 5.0  # the hello must arrive whole within this, or the connection is closed
    max_frame_bytes: int = 0

    def connection_limits(self) -> dict[str, Any]:
        """The `RpcServer` limits for this job.

        A hello is small (an identity and the token) except a worker's after a coordinator restart,
        which carries its generation (about 150 bytes a member; 1 KiB allowed for long host names).
        Later frames are capped at 8 MiB (tracebacks and output tails are the largest) or the hello's
        cap if larger. Each worker and each agent holds one connection (restart mode: the slot too);
        at most `max_np` of them may be saying hello at once when a job starts.
        """
        ranks = min(max(self.max_np, 1), 1 << 16)
        hello = 64 * 1024 + 1024 * ranks
        return {
            "max_connections": self.max_connections or max(1024, 4 * ranks + 64),
            "max_unauthenticated": self.max_unauthenticated or max(64, 2 * ranks),
            "hello_timeout_s": self.hello_timeout_s,
            "max_hello_bytes": hello,
            "max_frame_bytes": self.max_frame_bytes or max(8 * 1024 * 1024, hello),
        }


@dataclass
class WorkerRecord:
    """What the coordinator knows about one worker (`peer`: its connection's opaque handle)."""

    worker_id: str
    host: str
    local_rank: int
    state: WorkerState = WorkerState.STARTING
    pid: int = 0
    peer: Hashable | None = None
    join_request: Join | None = None  # a join held until the next generation forms
    committed_step: int = -1
    port: int = 0
    address: str = ""
    rejoin: Rejoin | None = None
    joined: bool = False  # it has asked to join at least once (a worker that never does: not elastrain)
    last_seen: float = 0.0  # monotonic time of its last sign of life
    since: float = 0.0  # monotonic time it began waiting to join


@dataclass
class Outcome:
    """How the job ended."""

    success: bool
    message: str = ""
    worker_id: str = ""
