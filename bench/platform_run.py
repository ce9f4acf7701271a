"""One replay of a compressed trace slice through a real `elastrain server` (process backend, virtual
GPUs): each trace job becomes a cluster created at its arrival (1 GPU per container, the job's
size, bounds = its worker range) and an `elastrain job submit NAME -- elastrain run --min-np A
--max-np B ... python bench/platform_job.py ...` once the cluster's launcher runs
(the request `elastrain job submit` sends, made by the replay's client: a CLI process per job would
cost seconds of this 2-core machine's CPU); the cluster is
deleted when the job ends (the trace job is over). Every ``poll_s`` the replay samples the GPUs held
(containers that hold GPUs: Pending, Running, Paused, Terminating) and the jobs waiting (arrived,
not ended, no Running container), which `platform_trace.idle_while_waiting` integrates.

JCT = the job's end as the replay sees it (the API says it ended) - the cluster's creation.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from platform_trace import Work  # bench/ is on sys.path (run as bench/platform_bench.py)

from elastrain.client import Client, ClientError, ClusterInfo
from elastrain.scheduler.trace import TraceJob
from elastrain.testing.processes import kill_env_tagged
from elastrain.testing.server import ControlPlane

JOB_SCRIPT = Path(__file__).resolve().with_name("platform_job.py")
TAG_ENV = "BENCH_PLATFORM_TAG"  # every process of a replay inherits it (cleanup by PID)
HOLDS = ("Pending", "Running", "Paused", "Terminating")
ENDED = ("Succeeded", "Failed", "Cancelled")


@dataclass
class Replayed:
    """One trace job on the platform (bench seconds from the replay's start)."""

    job: TraceJob
    cluster: str
    arrived: float | None = None
    job_id: int | None = None
    submitted: float | None = None  # the job submitted (its cluster's launcher ran)
    first_step: float | None = None  # the job first reported a step
    ended: float | None = None
    status: str = ""

    def record(self) -> dict[str, object]:
        """The job's times and sizes (for the JSON)."""
        return {
            "cluster": self.cluster, "trace_job": self.job.job_id, "gpus": self.job.num_gpus,
            "run_s": self.job.duration_s, "arrived": self.arrived, "submitted": self.submitted,
            "first_step": self.first_step, "ended": self.ended, "status": self.status,
        }  # fmt: skip

    @property
    def jct(self) -> float:
        """Completion - arrival."""
        assert self.arrived is not None and self.ended is not None
        return self.ended - self.arrived


@dataclass
class RunResult:
    """What one replay measured."""

    mode: str
    jobs: list[Replayed]
    series: list[tuple[float, int, int]] = field(default_factory=list)  # (t, GPUs held, jobs waiting)
    end_s: float = 0.0
    wall_s: float = 0.0
    max_held: int = 0
    resizes: int = 0


def job_command(work: Work, low: int, high: int) -> list[str]:
    """The `elastrain run` command of one job (its range, the cluster's hostfile, the script)."""
    run = ["elastrain", "run", "--min-np", str(low), "--max-np", str(high), "--hostfile", "/etc/mpi/hostfile"]
    return [*run, sys.executable, str(JOB_SCRIPT), *work.args()]


def server_env(tag: str) -> dict[str, str]:
    """The server's environment: the venv's `elastrain` first on PATH, this checkout importable, the tag."""
    env = {k: v for k, v in os.environ.items() if k.upper() != "ELASTRAIN_DB"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    repo = str(JOB_SCRIPT.parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, env.get("PYTHONPATH", "")) if p)
    env[TAG_ENV] = tag
    return env


class Replay:
    """Drives one server through the slice (see the module docstring)."""

    def __init__(
        self,
        root: Path,
        mode: str,
        gpus: int,
        jobs: list[TraceJob],
        works: list[Work],
        ranges: list[tuple[int, int]],
        poll_s: float = 0.5,
        deadline_s: float = 1200.0,
    ) -> None:
        self.mode, self.gpus, self.poll_s, self.deadline_s = mode, gpus, poll_s, deadline_s
        self.tag = f"{root.name}-{mode}-{os.getpid()}"
        self.plane = ControlPlane(
            root / mode, gpus=gpus, extra_args=("--scheduler", mode), env=server_env(self.tag)
        )
        self.items = [Replayed(j, f"j{i:02d}") for i, j in enumerate(jobs)]
        self.works = {r.cluster: w for r, w in zip(self.items, works)}
        self.ranges = {r.cluster: rng for r, rng in zip(self.items, ranges)}
        self.result = RunResult(mode, self.items)

    def run(self, log: bool = True) -> RunResult:
        """Start the server, replay, stop everything; the result."""
        self.plane.start()
        try:
            with self.plane.client() as client:
                self._loop(client, log)
            self.result.resizes = self._resizes()
        finally:
            self.plane.stop()
            kill_env_tagged(TAG_ENV, self.tag)
        return self.result

    def _loop(self, client: Client, log: bool) -> None:
        t0 = time.monotonic()
        while True:
            now = time.monotonic() - t0
            for item in self.items:
                if item.arrived is None and item.job.submit_s <= now:
                    self._create(client, item, now)
            clusters = {c.name: c for c in client.list_clusters()}
            jobs = {j["id"]: j for j in client.list_jobs()}
            now = time.monotonic() - t0
            held = len(
                {g for c in clusters.values() for k in c.containers if k.state in HOLDS for g in k.gpu_ids}
            )
            waiting = 0
            for item in self.items:
                info = clusters.get(item.cluster)
                if item.arrived is None or item.ended is not None:
                    continue
                if info is None or not any(k.state == "Running" for k in info.containers):
                    waiting += 1
                self._advance(client, item, info, jobs, now)
            self.result.series.append((now, held, waiting))
            self.result.max_held = max(self.result.max_held, held)
            if all(i.ended is not None for i in self.items):
                self.result.end_s = now
                self.result.wall_s = now
                return
            if now > self.deadline_s:
                raise TimeoutError(f"{self.mode}: not every job ended within {self.deadline_s:g} s")
            if log and len(self.result.series) % 20 == 0:
                done = sum(i.ended is not None for i in self.items)
                print(f"  [{self.mode} {now:5.0f} s] {done}/{len(self.items)} done, {held} GPUs held, "
                      f"{waiting} waiting", flush=True)  # fmt: skip
            time.sleep(max(0.0, self.poll_s - (time.monotonic() - t0 - now)))

    def _create(self, client: Client, item: Replayed, now: float) -> None:
        low, high = self.ranges[item.cluster]
        n = item.job.num_gpus
        client.create_cluster(
            item.cluster, containers=n, gpus_per_container=1, min_containers=low, max_containers=high
        )
        item.arrived = now

    def _advance(
        self, client: Client, item: Replayed, info: ClusterInfo | None, jobs: dict, now: float
    ) -> None:
        """Submit once the launcher runs; note the first step and the end; delete an ended job's cluster."""
        if item.job_id is None:
            if info is not None and info.running("launcher"):
                low, high = self.ranges[item.cluster]
                job = client.submit_job(item.cluster, job_command(self.works[item.cluster], low, high))
                item.job_id, item.submitted = int(job["id"]), now
            return
        job = jobs.get(item.job_id)
        if job is None:
            return
        if item.first_step is None and (job.get("step") or 0) > 0:
            item.first_step = now
        if job["status"] in ENDED:
            item.ended, item.status = now, job["status"]
            try:
                client.delete_cluster(item.cluster)
            except ClientError as exc:
                if exc.status != 404:
                    raise

    def _resizes(self) -> int:
        """The scheduler's resize decisions (events `cluster.rescheduled`) in this run."""
        import sqlite3

        db = self.plane.data / "elastrain.db"
        with sqlite3.connect(db) as conn:
            row = conn.execute("SELECT COUNT(*) FROM events WHERE action = 'cluster.rescheduled'").fetchone()
        return int(row[0])
