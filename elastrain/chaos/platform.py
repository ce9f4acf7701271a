"""Platform chaos as data: the faults `elastrain chaos --platform` injects into a container-backend
cluster (podman) running an elastic job, the scenarios, the soak's seeded schedule and its summary.

The faults act on the platform, not on processes: a container killed (`podman kill`), a container's
network cut and restored, the server killed in the middle of a scale, every container stopped at once
(a machine reboot), the data directory's disk full. `elastrain.chaos.platform_runner` injects them.
"""

from __future__ import annotations

import enum
import random
from dataclasses import dataclass

from elastrain.errors import ConfigError


class PlatformFaultKind(str, enum.Enum):
    """What happens to the platform."""

    KILL_WORKER = "kill-worker"  # podman kill of a worker container
    KILL_LAUNCHER = "kill-launcher"  # podman kill of the launcher container (the job's coordinator)
    NETWORK_CUT = "network-cut"  # podman network disconnect of a worker container, then connect
    SERVER_KILL_DURING_SCALE = "server-kill-during-scale"  # kill -9 the server right after a scale
    REBOOT = "reboot"  # every container stopped at once and the server killed, then the server restarted
    DISK_FULL = "disk-full"  # the data directory's file system filled to the last byte, then freed


@dataclass(frozen=True)
class PlatformFault:
    """One fault, injected once the job committed `after_steps` more steps; `target` picks the worker
    container (an index into the cluster's running workers, modulo their count)."""

    kind: PlatformFaultKind
    after_steps: int = 15
    target: int = 0


@dataclass(frozen=True)
class PlatformScenario:
    """A named fault schedule and what it promises, in words."""

    name: str
    faults: tuple[PlatformFault, ...]
    promise: str


PLATFORM_SCENARIOS: dict[str, PlatformScenario] = {
    s.name: s
    for s in (
        PlatformScenario(
            "kill-worker",
            (PlatformFault(PlatformFaultKind.KILL_WORKER),),
            "the job shrinks, the container is replaced and the job grows back",
        ),
        PlatformScenario(
            "kill-launcher",
            (PlatformFault(PlatformFaultKind.KILL_LAUNCHER),),
            "the job starts again in the new launcher with --rejoin and adopts the running workers",
        ),
        PlatformScenario(
            "network-cut",
            (PlatformFault(PlatformFaultKind.NETWORK_CUT),),
            "the cut-off worker is dropped on missed heartbeats; once reconnected the job grows back",
        ),
        PlatformScenario(
            "server-kill-during-scale",
            (PlatformFault(PlatformFaultKind.SERVER_KILL_DURING_SCALE),),
            "the restarted server finishes the scale: no duplicate container, no lost one",
        ),
        PlatformScenario(
            "reboot",
            (PlatformFault(PlatformFaultKind.REBOOT),),
            "the cluster comes back and the job resumes from its newest checkpoint",
        ),
        PlatformScenario(
            "disk-full",
            (PlatformFault(PlatformFaultKind.DISK_FULL),),
            "reads keep working, writes answer 507; nothing is corrupt once space returns",
        ),
    )
}

SOAK_KINDS = (
    PlatformFaultKind.KILL_WORKER,
    PlatformFaultKind.KILL_LAUNCHER,
    PlatformFaultKind.NETWORK_CUT,
    PlatformFaultKind.SERVER_KILL_DURING_SCALE,
    PlatformFaultKind.REBOOT,
    PlatformFaultKind.DISK_FULL,
)


def parse_platform_scenarios(spec: str) -> list[PlatformScenario]:
    """``a,b`` (or ``all``) -> scenarios; an unknown name is refused with the list of valid ones."""
    names = (
        list(PLATFORM_SCENARIOS)
        if spec.strip() == "all"
        else [n.strip() for n in spec.split(",") if n.strip()]
    )
    unknown = [n for n in names if n not in PLATFORM_SCENARIOS]
    if unknown or not names:
        raise ConfigError(
            f"unknown platform scenario {', '.join(unknown) or spec!r}; "
            f"choose from {', '.join(PLATFORM_SCENARIOS)}, all (see elastrain chaos --platform --list)"
        )
    return [PLATFORM_SCENARIOS[n] for n in names]


def soak_schedule(
    seed: int, count: int, kinds: tuple[PlatformFaultKind, ...] = SOAK_KINDS
) -> list[PlatformFault]:
    """`count` faults drawn from `kinds` with `seed` (the same seed, the same schedule): every kind
    appears once before any repeats (when `count` allows), never the same kind twice in a row."""
    if count < 1:
        raise ConfigError(f"the soak needs at least 1 fault, got {count}")
    rng = random.Random(seed)
    faults: list[PlatformFault] = []
    while len(faults) < count:
        batch = list(kinds)
        rng.shuffle(batch)
        if faults and len(batch) > 1 and batch[0] == faults[-1].kind:
            batch[0], batch[-1] = batch[-1], batch[0]
        for kind in batch[: count - len(faults)]:
            faults.append(PlatformFault(kind, after_steps=rng.randint(8, 20), target=rng.randrange(8)))
    return faults


def soak_line(faults: int, duplicated: int, missing: int, orphaned: int) -> str:
    """The soak's last line (the interface the checks read)."""
    return f"soak-platform: {faults} faults, {duplicated} duplicated, {missing} missing, {orphaned} orphaned"
