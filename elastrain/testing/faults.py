"""Fault injection: faults as data (`FaultKind`, `Fault`) and the actions that inject them into a
running job (by the PIDs its ledger recorded), shared by the chaos scenarios, the soak and the tests.

Network partitions need network namespaces (`elastrain.chaos.netns`); the disk faults act on the
checkpoint directory.
"""

from __future__ import annotations

import enum
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastrain.testing.jobs import JobWatcher, LedgerRecords
from elastrain.testing.processes import kill_pids


class FaultKind(str, enum.Enum):
    """What to do to the job."""

    KILL_WORKER = "kill-worker"  # SIGKILL one worker process
    STOP_WORKER = "stop-worker"  # SIGSTOP one worker until it is dropped, then SIGCONT
    KILL_AGENT = "kill-agent"  # SIGKILL the agent of one host (its workers die with it)
    KILL_COORDINATOR = "kill-coordinator"  # SIGKILL the launcher (coordinator); everything under it dies
    KILL_ALL = "kill-all"  # SIGKILL the launcher, every agent and every worker
    CORRUPT_CHECKPOINT = "corrupt-checkpoint"  # truncate the newest durable checkpoint
    FILL_DISK = "fill-disk"  # fill the checkpoint file system (a small tmpfs) to the last byte
    PARTITION_HOST = "partition-host"  # cut one host off the network until it is dropped, then reconnect
    KILL_SERVER = "kill-server"  # SIGKILL the control-plane server (and a worker while it is down)


@dataclass(frozen=True)
class Fault:
    """One fault: `kind` once `at_step` steps are committed; `target` indexes the generation's members."""

    kind: FaultKind
    at_step: int = 0
    target: int = -1


def current_members(watcher: JobWatcher) -> list[dict[str, Any]]:
    """The members (worker_id, host, pid, ...) of the job's newest generation."""
    return list(watcher.generations()[-1]["members"])


def kill_member(member: dict[str, Any], sig: int = signal.SIGKILL) -> None:
    """Send `sig` to one member's worker process."""
    kill_pids([int(member["pid"])], sig)


def agent_pid(records: LedgerRecords, host: str) -> int:
    """The PID of the agent on `host` (the newest the job recorded)."""
    agents = {e["host"]: e["pid"] for e in records.events() if e.get("event") == "agent"}
    return int(agents[host])


def wait_dropped(watcher: JobWatcher, victim: dict[str, Any]) -> None:
    """Wait until `victim` is no longer a member of the newest generation."""
    watcher.wait(
        f"worker {victim['worker_id']} to be dropped",
        lambda: victim["worker_id"] not in {m["worker_id"] for m in current_members(watcher)},
    )


def stop_until_dropped(watcher: JobWatcher, victim: dict[str, Any]) -> None:
    """SIGSTOP `victim` until the job has dropped it, then SIGCONT it (it comes back fenced)."""
    kill_member(victim, signal.SIGSTOP)
    try:
        wait_dropped(watcher, victim)
    finally:
        kill_member(victim, signal.SIGCONT)


def truncate_checkpoint(checkpoint: Path) -> Path:
    """Cut a checkpoint's state file to half its size; returns the file."""
    state = checkpoint / "state.pt"
    state.write_bytes(state.read_bytes()[: state.stat().st_size // 2])
    return state
