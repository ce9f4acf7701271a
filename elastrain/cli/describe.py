"""``elastrain cluster describe NAME``: everything about one cluster for a human, kubectl-style —
its spec, containers (state, address, GPUs), hostfile, recent events and jobs."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from elastrain.cli.table import format_table
from elastrain.server.event_text import event_text

if TYPE_CHECKING:
    from elastrain.client import Client, ClusterInfo

RECENT_EVENTS = 10
RECENT_JOBS = 10


def _when(stamp: str | None) -> str:
    return (stamp or "-")[:19].replace("T", " ")


def _indent(text: str) -> list[str]:
    return [f"  {line}" for line in text.splitlines()]


def _spec_lines(cluster: ClusterInfo) -> list[str]:
    raw = cluster.raw
    elastic = (
        f" (elastic {cluster.min_containers}..{cluster.max_containers})"
        if cluster.min_containers != cluster.max_containers
        else ""
    )
    fields: list[tuple[str, Any]] = [
        ("Name", cluster.name),
        ("Owner", cluster.owner or "-"),
        ("Framework", cluster.framework),
        ("Image", cluster.image or "(the framework's image)"),
        ("State", cluster.state + (f" ({cluster.reason})" if cluster.reason else "")),
        ("Containers", f"{len(cluster.running())}/{cluster.desired_containers} running{elastic}"),
        ("Size reason", cluster.size_reason or "-"),
        ("Priority", cluster.priority),
        ("GPUs/container", cluster.gpus_per_container),
        ("GPU type", cluster.gpu_type or "any"),
        ("Shared memory", cluster.shm or "-"),
        ("Memory", raw.get("memory") or "no limit"),
        ("CPUs", raw.get("cpus") or "no limit"),
        ("Mounts", ", ".join(cluster.mounts) or "none"),
        ("Restart policy", raw.get("restart_policy", "-")),
        ("Created", _when(raw.get("created_at"))),
        ("Hostfile gen.", cluster.hostfile_generation),
    ]
    width = max(len(k) for k, _ in fields) + 2
    return [f"{k + ':':<{width}}{v}" for k, v in fields]


def _container_lines(cluster: ClusterInfo) -> list[str]:
    if not cluster.containers:
        return ["  none yet"]
    rows = [["NAME", "ROLE", "STATE", "ADDRESS", "GPUS", "PID", "STARTED"]]
    for c in cluster.containers:
        gpus = f"{c.gpus} ({','.join(map(str, c.gpu_ids))})" if c.gpu_ids else str(c.gpus)
        state = c.state + (f": {c.reason}" if c.reason else "")
        pid = str(c.pid) if c.pid else "-"
        rows.append([c.name, c.role, state, c.address or "-", gpus, pid, _when(c.started_at)])
    return _indent(format_table(rows))


def _hostfile_lines(client: Client, name: str) -> list[str]:
    from elastrain.client import ClientError

    try:
        text = client.hostfile(name)
    except ClientError as exc:  # e.g. no container has an address yet
        return [f"  (not available: {exc})"]
    return _indent(text) or ["  (empty)"]


def _event_lines(client: Client, name: str) -> list[str]:
    events = client.events(name)[-RECENT_EVENTS:]
    if not events:
        return ["  none"]
    rows = [["AT", "BY", "EVENT"]]
    for e in events:
        rows.append([_when(e.get("at")), str(e.get("actor", "")), event_text(e)])
    return _indent(format_table(rows))


def _job_lines(client: Client, name: str) -> list[str]:
    jobs = client.list_jobs(name)[-RECENT_JOBS:]
    if not jobs:
        return ["  none"]
    rows = [["ID", "STATUS", "EXIT", "COMMAND"]]
    for job in jobs:
        code = "-" if job.get("exit_code") is None else str(job["exit_code"])
        rows.append([str(job["id"]), str(job["status"]), code, " ".join(job.get("command", []))[:60]])
    return _indent(format_table(rows))


def describe_cluster(client: Client, name: str) -> str:
    """The text of ``elastrain cluster describe NAME`` (a 404 for an unknown cluster raises)."""
    cluster = client.get_cluster(name)
    lines = _spec_lines(cluster)
    lines += ["", "Containers:", *_container_lines(cluster)]
    lines += ["", f"Hostfile (generation {cluster.hostfile_generation}):", *_hostfile_lines(client, name)]
    lines += ["", f"Events (last {RECENT_EVENTS}):", *_event_lines(client, name)]
    lines += ["", f"Jobs (last {RECENT_JOBS}):", *_job_lines(client, name)]
    hint = cluster.raw.get("launch_hint")
    if hint:
        lines += ["", f"Run training: elastrain cluster exec {name} -- {hint}"]
    return "\n".join(lines)
