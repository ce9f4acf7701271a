"""Inject one platform fault into a `PlatformCluster` and measure it: detection (the fault to the first
sign that the platform or the job saw it), recovery (the fault to the job committing a step at its
full size again, or the data directory writable again), steps lost, orphaned containers.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from elastrain.backends.podmanctl import podman
from elastrain.chaos.platform import PlatformFault, PlatformFaultKind
from elastrain.chaos.platform_plane import CLUSTER, PlatformCluster
from elastrain.client import ClientError
from elastrain.errors import ElastrainError
from elastrain.report import build_report
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import server_containers
from elastrain.testing.waits import wait_until

RECOVERY_S = 240.0  # the bound on one fault's recovery (a reboot restarts every container and the job)


class JobEnded(ElastrainError):
    """The job ended before the schedule was through (its runway, epochs x step sleep, was too short)."""


@dataclass
class FaultFigures:
    """What one fault did."""

    kind: str
    target: str
    detect_s: float | None = None
    recover_s: float | None = None
    steps_lost: int = 0
    orphaned: int = 0
    notes: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The figures as JSON-able data."""
        return asdict(self)


def _events(ledger: Path) -> list[dict[str, Any]]:
    path = ledger / "events.jsonl"
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return [e for e in out if e.get("event") == "generation"]


class CommitLog:
    """The job's commit records, read incrementally from its ledger files (only what was appended since
    the last look is parsed: the soak's ledger grows to megabytes and is polled several times a second)."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger
        self._offsets: dict[Path, int] = {}
        self.commits: dict[tuple[str, int, int], float] = {}  # (run, generation, step) -> first commit time

    def refresh(self) -> CommitLog:
        """Read what the workers appended since the last call."""
        for path in sorted(self.ledger.glob("*.jsonl")):
            if path.name == "events.jsonl":
                continue
            with open(path, "rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
            complete = chunk[: chunk.rfind(b"\n") + 1]  # a torn last line is read next time
            self._offsets[path] = self._offsets.get(path, 0) + len(complete)
            for line in complete.splitlines():
                if b'"k":"c"' not in line.replace(b" ", b""):
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError:
                    continue
                key = (r.get("run", ""), int(r["g"]), int(r["s"]))
                self.commits[key] = min(self.commits.get(key, r["t"]), r["t"])
        return self

    def count(self) -> int:
        """Steps committed so far (every generation, every run; a step once per generation)."""
        return len(self.refresh().commits)

    def first_full_commit(self, since: float, world: int) -> float | None:
        """When the job first committed a step in a generation of `world` workers requested after `since`."""
        generations = {
            (e.get("run", ""), e["generation"])
            for e in _events(self.ledger)
            if e["requested_at"] >= since and int(e["world_size"]) == world
        }
        times = [t for (run, g, _), t in self.refresh().commits.items() if (run, g) in generations]
        return min(times) if times else None


def _first_generation_after(ledger: Path, since: float) -> float | None:
    times = [e["requested_at"] for e in _events(ledger) if e["requested_at"] >= since]
    return min(times) if times else None


def steps_lost_since(ledger: Path, since: float) -> int:
    """Steps rolled back by the generations requested after `since`."""
    keys = {(e.get("run", ""), e["generation"]) for e in _events(ledger) if e["requested_at"] >= since}
    report = build_report(ledger, 1)
    return sum(g["steps_lost"] for g in report["generations"] if (g["run"], g["generation"]) in keys)


class Injector:
    """Injects faults into `pc` one at a time (each waits for the job to commit its `after_steps`)."""

    def __init__(self, pc: PlatformCluster, say: Callable[[str], None]) -> None:
        self.pc = pc
        self.say = say
        self.commits = CommitLog(pc.ledger)

    def world(self) -> int:
        """The cluster's desired size: the job's full world."""
        with self.pc.client() as c:
            return c.get_cluster(CLUSTER).desired_containers

    def workers(self) -> list[str]:
        """The cluster's Running worker containers (names in the API)."""
        with self.pc.client() as c:
            return sorted(k.name for k in c.get_cluster(CLUSTER).containers if k.role == "worker")

    def inject(self, fault: PlatformFault) -> FaultFigures:
        """Wait for `fault.after_steps` more steps, inject it, wait for recovery; returns the figures."""
        start = self.commits.count()
        with self.pc.client() as c:

            def ready() -> bool:
                if c.get_job(self.pc.job_id)["status"] != "Running":
                    raise JobEnded(f"the job ended before {fault.kind.value}: {self.pc.log_tail(1000)}")
                return self.commits.count() >= start + fault.after_steps

            wait_until(
                ready, 300, f"{fault.after_steps} committed steps before {fault.kind.value}", interval=0.2
            )
        action = {
            PlatformFaultKind.KILL_WORKER: self._kill_worker,
            PlatformFaultKind.KILL_LAUNCHER: self._kill_launcher,
            PlatformFaultKind.NETWORK_CUT: self._network_cut,
            PlatformFaultKind.SERVER_KILL_DURING_SCALE: self._server_kill_during_scale,
            PlatformFaultKind.REBOOT: self._reboot,
            PlatformFaultKind.DISK_FULL: self._disk_full,
        }[fault.kind]
        figures = action(fault)
        figures.orphaned = len(self.pc.orphans())
        self.say(f"{fault.kind.value}: {figures.as_dict()}")
        return figures

    def _recovered(self, figures: FaultFigures, t0: float, world: int) -> None:
        """Fill in recovery (the job training at `world` again), detection by the job, steps lost."""
        ledger = self.pc.ledger
        at = wait_until(
            lambda: self.commits.first_full_commit(t0, world),
            RECOVERY_S,
            f"the job to train at {world} again",
        )
        figures.recover_s = round(at - t0, 3)
        job_saw = _first_generation_after(ledger, t0)
        if job_saw is not None:
            seen = round(job_saw - t0, 3)
            figures.detect_s = seen if figures.detect_s is None else min(figures.detect_s, seen)
        figures.steps_lost = steps_lost_since(ledger, t0)

    def _watch_container(self, name: str, pid: int | None, t0: float) -> float:
        """Seconds from `t0` until the API shows container `name` no longer Running with `pid`."""
        with self.pc.client() as c:

            def changed() -> bool:
                found = [k for k in c.get_cluster(CLUSTER).containers if k.name == name]
                return not found or found[0].state != "Running" or found[0].pid != pid

            wait_until(changed, 60, f"the server to see {name} die", interval=0.05)
        return round(time.time() - t0, 3)

    def _podman_kill(self, name: str, fault: PlatformFault) -> FaultFigures:
        with self.pc.client() as c:
            pid = next(k.pid for k in c.get_cluster(CLUSTER).containers if k.name == name)
        world = self.world()
        self.say(f"podman kill {name}")
        t0 = time.time()
        podman("kill", self.pc.container_name(name))
        figures = FaultFigures(fault.kind.value, name)
        figures.detect_s = self._watch_container(name, pid, t0)
        self._recovered(figures, t0, world)
        return figures

    def _kill_worker(self, fault: PlatformFault) -> FaultFigures:
        workers = self.workers()
        return self._podman_kill(workers[fault.target % len(workers)], fault)

    def _kill_launcher(self, fault: PlatformFault) -> FaultFigures:
        figures = self._podman_kill(f"{CLUSTER}-launcher", fault)
        with self.pc.client() as c:
            job = c.get_job(self.pc.job_id)
        figures.notes["platform_restarts"] = job["platform_restarts"]
        return figures

    def _network_cut(self, fault: PlatformFault) -> FaultFigures:
        workers = self.workers()
        name = workers[fault.target % len(workers)]
        full = self.pc.container_name(name)
        network = f"elastrain-{self.pc.key}-{CLUSTER}"
        address = json.loads(podman("inspect", full, "--format", "json").stdout)[0]["NetworkSettings"][
            "Networks"
        ][network]["IPAddress"]
        world = self.world()
        figures = FaultFigures(fault.kind.value, name)
        self.say(f"podman network disconnect {network} {name} ({address})")
        t0 = time.time()
        podman("network", "disconnect", network, full)
        try:
            seen = wait_until(
                lambda: _first_generation_after(self.pc.ledger, t0), 60, "the job to drop the cut-off worker"
            )
            figures.detect_s = round(seen - t0, 3)
        finally:
            podman("network", "connect", "--ip", address, network, full)
            self.say(f"podman network connect {network} {name} --ip {address}")
        figures.notes["cut_s"] = round(time.time() - t0, 3)
        self._recovered(figures, t0, world)
        return figures

    def _server_kill_during_scale(self, fault: PlatformFault) -> FaultFigures:
        world = self.world()
        size = world + 1 if world < self.pc.max_np else world - 1
        before = set(server_containers(self.pc.key))
        figures = FaultFigures(fault.kind.value, f"scale {world} -> {size}")
        self.say(f"scale {world} -> {size}, then kill -9 the server in the middle of it")
        t0 = time.time()
        with self.pc.client() as c:
            c.scale_cluster(CLUSTER, size)
        if size > world:  # in the middle: the new container exists in podman, the server not yet done
            wait_until(lambda: set(server_containers(self.pc.key)) - before, 60, "the new container")
        self.pc.plane.kill()
        figures.notes["killed_after_s"] = round(time.time() - t0, 3)
        figures.detect_s = round(self.pc.plane.start(), 3)  # the restarted server answering
        with self.pc.client() as c:
            c.wait_cluster(CLUSTER, all_running, timeout=120)
            figures.notes["containers"] = len(c.get_cluster(CLUSTER).containers)
        figures.notes["podman_containers"] = len(server_containers(self.pc.key))
        self._recovered(figures, t0, size)
        return figures

    def _reboot(self, fault: PlatformFault) -> FaultFigures:
        world = self.world()
        names = server_containers(self.pc.key)
        figures = FaultFigures(fault.kind.value, f"{len(names)} containers and the server")
        self.say(f"reboot: kill -9 the server, stop {len(names)} containers at once")
        t0 = time.time()
        self.pc.plane.kill()
        podman("stop", "--time", "0", *names, check=False)
        figures.notes["server_restart_s"] = round(self.pc.plane.start(), 3)
        figures.detect_s = self._cluster_back(t0)
        self._recovered(figures, t0, world)
        with self.pc.client() as c:
            job = c.get_job(self.pc.job_id)
        figures.notes["platform_restarts"] = job["platform_restarts"]
        return figures

    def _cluster_back(self, t0: float) -> float:
        """Seconds from `t0` until the restarted server has the cluster Running again (a reboot's
        detection: the server saw every container gone and replaced them)."""
        with self.pc.client() as c:
            c.wait_cluster(CLUSTER, all_running, timeout=120)
        return round(time.time() - t0, 3)

    def _disk_full(self, fault: PlatformFault) -> FaultFigures:
        data = self.pc.plane.data
        filler = data / "chaos-filler"
        figures = FaultFigures(fault.kind.value, str(data))
        self.say(f"fill {data} to the last byte")
        t0 = time.time()
        fill(filler)
        try:
            figures.notes.update(self._probe_full(t0, figures))
            steps = self.commits.count()  # the job trains on while the disk stays full
            wait_until(lambda: self.commits.count() >= steps + 5, 60, "5 steps on a full disk", interval=0.2)
            figures.notes["full_for_s"] = round(time.time() - t0, 3)
            with self.pc.client() as c:
                figures.notes["read_after_steps"] = c.get_job(self.pc.job_id)["status"]
        finally:
            filler.unlink(missing_ok=True)
        freed = time.time()
        with self.pc.client() as c:
            user = wait_until(lambda: _try_write(c, "chaos-after"), 30, "a write to succeed again")
        figures.recover_s = round(time.time() - freed, 3)
        figures.notes["write_after"] = user
        figures.notes["integrity"] = integrity(data / "elastrain.db")
        return figures

    def _probe_full(self, t0: float, figures: FaultFigures) -> dict[str, Any]:
        """Reads answer, writes answer 507 (a few tries: free pages may take the first small ones)."""
        with self.pc.client() as c:
            job = c.get_job(self.pc.job_id)  # a read
            clusters = len(c.list_clusters())
            refusals: list[int] = []
            for _ in range(50):  # a write that fits in the pages SQLite already holds is stored
                try:
                    c.create_user(f"chaos-full-{time.monotonic_ns()}")
                except ClientError as exc:
                    refusals.append(exc.status)
                    if figures.detect_s is None:
                        figures.detect_s = round(time.time() - t0, 3)
                    if exc.status in (503, 507):
                        break
        return {
            "read_job_status": job["status"],
            "read_clusters": clusters,
            "write_statuses": refusals,
            "server_errors": sum(status not in (503, 507) for status in refusals),
        }


def fill(path: Path) -> int:
    """Write `path` until its file system is full; returns the bytes written."""
    written = 0
    block = b"\0" * (1 << 16)
    with open(path, "wb", buffering=0) as f:
        while True:
            try:
                written += f.write(block)
            except OSError:
                break
        while True:  # the last partial block
            try:
                if not f.write(b"\0" * 512):
                    break
                written += 512
            except OSError:
                break
    return written


def _try_write(c: Any, name: str) -> str | None:
    try:
        c.create_user(f"{name}-{time.monotonic_ns()}")
    except ClientError:
        return None
    return "ok"


def integrity(db: Path) -> str:
    """SQLite's ``PRAGMA integrity_check`` of the server's database (``ok`` when sound)."""
    import sqlite3

    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])
