"""The chaos scenarios: a job shape and its fault schedule (faults as data: `elastrain.testing.faults`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from elastrain.errors import ConfigError
from elastrain.testing.faults import Fault, FaultKind

__all__ = ["SCENARIOS", "Fault", "FaultKind", "Scenario", "parse_scenarios"]


@dataclass(frozen=True)
class Scenario:
    """A job shape and its fault schedule. `restart`: the job is started again (with --resume auto)."""

    name: str
    hosts: int
    run_args: tuple[str, ...]
    faults: tuple[Fault, ...]
    restart: bool = False
    checkpoints: bool = False
    small_disk: bool = False  # checkpoints go to a small tmpfs (needs root; skipped otherwise)
    netns: bool = False  # every host in its own network namespace on a private bridge (needs root)
    control_plane: bool = False  # the job is submitted to a private `elastrain server` (kill-server)
    restart_args: tuple[str, ...] = ()  # extra flags for the second start (e.g. --rejoin)
    expect_exit: int = 0  # what the first run's launcher should exit with when not killed
    notes: str = ""
    extra: dict[str, str] = field(default_factory=dict)


_ELASTIC = ("--min-np", "2", "--max-np", "3")

SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("kill-worker", 3, _ELASTIC, (Fault(FaultKind.KILL_WORKER, 40),)),
        Scenario(
            "stop-worker",
            3,
            (*_ELASTIC, "--heartbeat-timeout", "3", "--join-grace", "1"),
            (Fault(FaultKind.STOP_WORKER, 40),),
        ),
        Scenario("kill-agent", 3, _ELASTIC, (Fault(FaultKind.KILL_AGENT, 40),)),
        Scenario(
            "partition-host",
            3,
            (*_ELASTIC, "--heartbeat-timeout", "3", "--join-grace", "1"),
            (Fault(FaultKind.PARTITION_HOST, 40),),
            netns=True,
            notes="the host's bridge port goes down: dropped on missed heartbeats, fenced when it is back",
        ),
        Scenario(
            "kill-server",
            3,  # containers; the workers are whatever the cluster's hostfile lists (2 or 3)
            ("--min-np", "1", "--max-np", "3", "--join-grace", "1"),
            (Fault(FaultKind.KILL_SERVER, 40),),
            control_plane=True,
            notes="the job trains on without the server; the restarted server adopts it and gets its reports",
        ),
        Scenario(
            "kill-coordinator",
            2,
            ("-np", "2"),
            (Fault(FaultKind.KILL_COORDINATOR, 100),),
            restart=True,
            checkpoints=True,
            restart_args=("--rejoin",),
            notes="a replacement launcher (--rejoin, same port and token) adopts the running workers",
        ),
        Scenario(
            "coordinator-gone",
            2,
            ("-np", "2", "--heartbeat-timeout", "3"),
            (Fault(FaultKind.KILL_COORDINATOR, 100),),
            restart=True,
            checkpoints=True,
            notes="no launcher comes back: rank 0 writes a checkpoint, workers exit 3; a new run resumes",
        ),
        Scenario(
            "corrupt-checkpoint",
            2,
            ("-np", "2"),
            (Fault(FaultKind.KILL_ALL, 200), Fault(FaultKind.CORRUPT_CHECKPOINT)),
            restart=True,
            checkpoints=True,
        ),
        Scenario(
            "kill-all-resume",
            2,
            ("-np", "2"),
            (Fault(FaultKind.KILL_ALL, 200),),
            restart=True,
            checkpoints=True,
        ),
        Scenario(
            "fill-disk",
            2,
            ("-np", "2"),
            (Fault(FaultKind.FILL_DISK, 100),),
            checkpoints=True,
            small_disk=True,
            notes="saves fail with a warning naming the step; training goes on",
        ),
    )
}


def parse_scenarios(spec: str) -> list[Scenario]:
    """``a,b,c`` (or ``all``) -> scenarios; unknown names are refused with the list of valid ones."""
    names = list(SCENARIOS) if spec.strip() == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    unknown = [n for n in names if n not in SCENARIOS]
    if unknown or not names:
        raise ConfigError(
            f"unknown scenario {', '.join(unknown) or spec!r}; "
            f"choose from {', '.join(SCENARIOS)}, all (or soak alone)"
        )
    return [SCENARIOS[n] for n in names]
