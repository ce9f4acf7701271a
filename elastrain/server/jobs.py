"""Jobs: detached commands in a cluster's launcher container, their status, logs and progress.

A job runs under ``elastrain.backends.jobrun``, which records the exit code in a file next to the
log, so a restarted server still learns how a job ended. Progress comes from the job itself
(``POST /api/v1/jobs/{id}/progress`` with its report token, see `elastrain.client.report_progress`)
or, as a fallback, from the ``epoch N done: world W, step S, loss L`` lines elastrain's examples print
and the ``generation G formed: W workers`` lines of ``elastrain run -v``. A report may carry other
scalars by name (`elastrain.report`), kept with the job's metrics. A job submitted with a
``tensorboard_dir`` gets it as ELASTRAIN_TENSORBOARD_DIR (`elastrain run`'s --tensorboard-dir default).
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import shlex
import signal
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from elastrain.backends.api import Backend, ContainerSpec
from elastrain.backends.procs import cmdline, pid_alive
from elastrain.backends.tenant_files import LOG_LIMIT
from elastrain.contracts.env import ReportEnv
from elastrain.db.models import (
    Cluster,
    Container,
    ContainerState,
    Event,
    EventAction,
    Job,
    JobMetric,
    JobStatus,
    User,
    utcnow,
)
from elastrain.db.repository import add_event, find_cluster, hash_token, visible_jobs
from elastrain.db.session import Database
from elastrain.errors import ElastrainError
from elastrain.server import job_recovery as recovery
from elastrain.server import schemas
from elastrain.server.errors import Conflict, InvalidRequest, NotFound, TooMany, Unauthorized
from elastrain.server.exec_service import ExecService, launcher_of
from elastrain.server.inventory import Inventory
from elastrain.server.job_files import (
    FIELDS,
    check_not_terminating,
    create_private_file,
    exit_path,
    job_out,
    log_path_of,
    progress_values,
    recheck_not_terminating,
)
from elastrain.server.job_limits import check_running_jobs
from elastrain.server.job_reads import JobFiles
from elastrain.server.job_resizes import resizes_from
from elastrain.server.membership import JobMembership
from elastrain.server.rate import RateLimiter
from elastrain.server.reconciler import aware, container_spec, tenant_uid
from elastrain.server.tenant_limits import DEFAULT_MAX_RUNNING_JOBS, DEFAULT_REPORT_RATE

TENSORBOARD_DIR_ENV = "ELASTRAIN_TENSORBOARD_DIR"  # read by `elastrain run` and `elastrain.report`
log = logging.getLogger(__name__)
ACTOR = "reconciler"  # who restarts jobs, in their events
JOB_EVENTS = "job."
"""The prefix of every job event's action (`EventAction.job_submitted`, ...): a job's trail."""


@dataclass
class JobService:
    """Submit, list, inspect, stream and cancel jobs; record progress."""

    db: Database
    backend: Backend
    inventory: Inventory
    report_url: str = ""
    membership: JobMembership = field(default_factory=JobMembership)
    exec_service: ExecService | None = None  # default: one on `backend` (`main` shares the server's)
    max_running_jobs: int = DEFAULT_MAX_RUNNING_JOBS  # per user (--max-running-jobs)
    reports: RateLimiter = field(default_factory=lambda: RateLimiter(DEFAULT_REPORT_RATE))  # per job
    _offsets: dict[int, int] = field(default_factory=dict)
    _attach_tokens: dict[str, tuple[int, str]] = field(default_factory=dict)  # hash -> (user id, cluster)
    _attach_lock: threading.Lock = field(default_factory=threading.Lock)
    _gone_since: dict[int, float] = field(default_factory=dict)  # job id -> when its command was seen gone
    files: JobFiles = field(init=False)

    def __post_init__(self) -> None:
        self.files = JobFiles(self.backend)
        if self.exec_service is None:
            self.exec_service = ExecService(self.backend, self.inventory)

    @property
    def commands(self) -> ExecService:
        """Where the jobs' commands are started."""
        assert self.exec_service is not None
        return self.exec_service

    def _cluster(self, session: Session, user: User, name: str) -> Cluster:
        cluster = find_cluster(session, user, name)
        if cluster is None:
            raise NotFound(f"cluster {name!r} not found")
        return cluster

    def submit(self, user: User, name: str, req: schemas.JobSubmit) -> schemas.JobOut:
        """Start the command detached in the launcher container."""
        secret = secrets.token_hex(24)
        with self.db.session() as session:
            cluster, launcher = self.commands.find(session, user, name)
            check_not_terminating(cluster)
            if launcher is None or launcher.state != ContainerState.Running:
                raise Conflict(f"cluster {name!r} has no Running launcher yet; wait for it and retry")
            spec = self.commands.spec(cluster, launcher)  # before the job's row: it may read others
            report_token = recovery.derived_token(secret, "report")
            job, _log = self._new_job(session, cluster, launcher.name, user, req.command, report_token)
            job.tensorboard_dir = req.tensorboard_dir
            job.restart_secret = secret
            job.max_user_restarts, job.max_platform_restarts = req.retries, req.max_platform_restarts
            if recovery.is_elastrain_run(req.command):
                job.coordinator_port = self._coordinator_port(session, cluster)
            self._start(cluster, launcher, job, req.command, spec)
            add_event(
                session, user.name, EventAction.job_submitted, name, user.id, job=job.id, command=req.command
            )
            return job_out(job, cluster.name)

    def _coordinator_port(self, session: Session, cluster: Cluster) -> int | None:
        """A fixed port for a new ``elastrain run`` job's coordinator (a replacement launcher listens on
        it again): one no other running job uses in the same network namespace (the cluster's own on a
        container backend; this machine's on the process backend, where it must also be free here)."""
        shared = self.backend.translates_paths  # the process backend: every cluster on this machine's network
        query = select(Job.coordinator_port).where(
            Job.status == JobStatus.Running, Job.coordinator_port.is_not(None)
        )
        if not shared:
            query = query.where(Job.cluster_id == cluster.id)
        taken = {port for port in session.scalars(query) if port is not None}
        if shared:
            return recovery.coordinator_port(taken, recovery.port_is_free, random.Random())
        return recovery.coordinator_port(taken)

    def _start(
        self, cluster: Cluster, launcher: Container, job: Job, command: list[str], spec: ContainerSpec
    ) -> None:
        """Start `command` as `job` in `launcher` (`spec`; detached, its exit code to the job's exit file)."""
        assert job.restart_secret is not None
        env = ReportEnv(
            url=self.backend.api_url(cluster.name, self.report_url),
            job_id=str(job.id),
            token=recovery.derived_token(job.restart_secret, "report"),
        ).to_env()
        if job.tensorboard_dir:
            env[TENSORBOARD_DIR_ENV] = job.tensorboard_dir
        if job.coordinator_port is not None:
            env[recovery.JOB_TOKEN_ENV] = recovery.derived_token(job.restart_secret, "coordinator")
            env[recovery.COORDINATOR_PORT_ENV] = str(job.coordinator_port)
            if not self.backend.translates_paths:  # agents reach a replacement launcher by its name
                env[recovery.COORDINATOR_HOST_ENV] = launcher.name
        exit_file = self.backend.path_inside(cluster.name, launcher.name, exit_path(job.id))
        proc = self.commands.start(spec, command, env=env, log_path=Path(job.log_path), exit_file=exit_file)
        job.pid, job.launcher_pid = proc.pid, launcher.pid

    def _new_job(
        self, session: Session, cluster: Cluster, launcher: str, user: User, command: list[str], token: str
    ) -> tuple[Job, Path]:
        """A Running job row with its report token, and its log file (headed by the command) in `launcher`;
        429 when `user` has `max_running_jobs` Running already."""
        check_running_jobs(session, user, self.max_running_jobs)
        job = Job(
            cluster_id=cluster.id,
            owner_id=user.id,
            command=json.dumps(command),
            status=JobStatus.Running,
            report_token_hash=hash_token(token),
        )
        session.add(job)
        name = cluster.name  # read now: a failed flush expires every loaded object
        try:
            session.flush()
        except IntegrityError as exc:  # the cluster's row went away under us (a delete finished)
            raise Conflict(f"cluster {name!r} is being deleted") from exc
        recheck_not_terminating(session, cluster)
        log_path = self.backend.container_path(cluster.name, launcher, log_path_of(job.id))
        log_path.parent.mkdir(parents=True, exist_ok=True)
        owner = None if self.backend.translates_paths else tenant_uid(cluster.owner_id)
        create_private_file(log_path, f"$ {shlex.join(command)}\n".encode(), owner)
        job.log_path = str(log_path)
        return job, log_path

    def attach_env(self, user: User, cluster: str) -> dict[str, str]:
        """Environment for a shell in `cluster`'s launcher: an ``elastrain run`` typed there becomes a job.

        The attach token is kept in memory (a shell does not outlive the server that started it).
        """
        token = secrets.token_urlsafe(24)
        with self._attach_lock:
            self._attach_tokens[hash_token(token)] = (user.id, cluster)
        url = self.backend.api_url(cluster, self.report_url)
        return {"ELASTRAIN_ATTACH_URL": url, "ELASTRAIN_ATTACH_TOKEN": token}

    def attach(self, token: str, req: schemas.JobAttach) -> schemas.JobAttached:
        """Register a running ``elastrain run`` (authenticated by an attach token) as a job."""
        with self._attach_lock:
            owner = self._attach_tokens.get(hash_token(token)) if token else None
        if owner is None:
            raise Unauthorized("unknown attach token (ELASTRAIN_ATTACH_TOKEN); open a new terminal")
        report_token = secrets.token_urlsafe(24)
        with self.db.session() as session:
            user = session.get(User, owner[0])
            cluster = find_cluster(session, user, owner[1]) if user is not None else None
            if user is None or cluster is None:
                raise NotFound(f"cluster {owner[1]!r} not found")
            check_not_terminating(cluster)
            launcher = launcher_of(cluster)
            if launcher is None:
                raise Conflict(f"cluster {cluster.name!r} has no launcher container")
            pid = self.backend.own_pid(container_spec(cluster, launcher, self.inventory.real), req.pid)
            if pid is None:
                raise InvalidRequest(f"pid {req.pid} is not a process of {launcher.name}")
            job, _log = self._new_job(session, cluster, launcher.name, user, req.command, report_token)
            job.pid = pid
            add_event(
                session,
                user.name,
                EventAction.job_attached,
                cluster.name,
                user.id,
                job=job.id,
                command=req.command,
            )
            inside = self.backend.path_inside
            return schemas.JobAttached(
                id=job.id,
                report_url=self.backend.api_url(cluster.name, self.report_url),
                report_token=report_token,
                log_path=inside(cluster.name, launcher.name, log_path_of(job.id)),
                exit_path=inside(cluster.name, launcher.name, exit_path(job.id)),
            )

    def _job(self, session: Session, user: User, job_id: int) -> tuple[Job, str]:
        job = session.get(Job, job_id)
        if job is None or (job.owner_id != user.id and not user.is_admin):
            raise NotFound(f"job {job_id} not found")
        cluster = session.get(Cluster, job.cluster_id)
        return job, cluster.name if cluster else "?"

    def get(self, user: User, job_id: int) -> schemas.JobOut:
        """One job, with its resizes."""
        with self.db.session() as session:
            job, cluster = self._job(session, user, job_id)
            out = job_out(job, cluster)
            found = self._job_events(session, job, cluster, EventAction.job_incident)
            out.resizes = resizes_from((aware(event.at) or event.at, detail) for event, detail in found)
            return out

    def list(self, user: User, cluster: str | None = None) -> list[schemas.JobOut]:
        """The caller's jobs (optionally of one cluster)."""
        with self.db.session() as session:
            only = self._cluster(session, user, cluster) if cluster else None
            names = {c.id: c.name for c in session.scalars(select(Cluster))}
            return [job_out(j, names.get(j.cluster_id, "?")) for j in visible_jobs(session, user, only)]

    def logs(self, user: User, job_id: int, offset: int) -> tuple[bytes, int, str]:
        """Log bytes from `offset` (at most `LOG_LIMIT`), the next offset and the job's status."""
        with self.db.session() as session:
            job, cluster = self._job(session, user, job_id)
            path, status = Path(job.log_path), job.status.value
        piece = self.files.log(cluster, path, max(offset, 0))
        return piece.data, max(offset, 0) + len(piece.data), status

    def cancel(self, user: User, job_id: int) -> schemas.JobOut:
        """Stop a running job (SIGTERM to its process group)."""
        with self.db.session() as session:
            job, cluster = self._job(session, user, job_id)
            if job.status == JobStatus.Running:  # also one waiting for its launcher's replacement
                row = session.get(Cluster, job.cluster_id)
                launcher = launcher_of(row) if row is not None else None
                if row is not None and launcher is not None and job.pid and self._alive(job):
                    spec = container_spec(row, launcher, self.inventory.real)
                    self.backend.stop_processes(
                        spec, "ELASTRAIN_JOB_ID", str(job.id), job.pid, signal.SIGTERM
                    )
                job.status, job.finished_at = JobStatus.Cancelled, utcnow()
                add_event(session, user.name, EventAction.job_cancelled, cluster, user.id, job=job.id)
            return job_out(job, cluster)

    def report(self, job_id: int, token: str, progress: schemas.JobProgress) -> None:
        """Record a progress report (authenticated by the job's own report token)."""
        with self.db.session() as session:
            job = self._authenticated(session, job_id, token)
            self._record(session, job, progress.model_dump())
            if progress.checkpoint is not None:
                self._add_job_event(
                    session, job, "job", EventAction.job_checkpoint, progress.checkpoint.model_dump()
                )
        if progress.hosts is not None:
            self.membership.record(job_id, progress.hosts)

    def checkpoints(self, user: User, job_id: int) -> Sequence[schemas.CheckpointOut]:
        """The checkpoints the job reported, newest first."""
        with self.db.session() as session:
            job, cluster = self._job(session, user, job_id)
            found = self._job_events(session, job, cluster, EventAction.job_checkpoint)
            out = []
            for event, detail in reversed(found):
                detail.pop("job")
                out.append(schemas.CheckpointOut(at=aware(event.at) or event.at, **detail))
            return out

    def record_incident(self, job_id: int, token: str, incident: schemas.JobIncident) -> None:
        """Store a generation change the job reported as a ``job.incident`` event of its cluster."""
        with self.db.session() as session:
            job = self._authenticated(session, job_id, token)
            detail = incident.model_dump(mode="json", exclude_none=True)
            self._add_job_event(session, job, "elastrain run", EventAction.job_incident, detail)

    def events(self, user: User, job_id: int) -> Sequence[schemas.EventOut]:
        """The job's events (submitted, incidents, checkpoints, cancelled), oldest first."""
        with self.db.session() as session:
            job, cluster = self._job(session, user, job_id)
            return [
                schemas.EventOut.stored(event.at, event.actor, event.action, cluster, detail)
                for event, detail in self._job_events(session, job, cluster)
            ]

    @staticmethod
    def _job_events(
        session: Session, job: Job, cluster: str, action: EventAction | None = None
    ) -> Sequence[tuple[Event, dict[str, Any]]]:
        """`job`'s events (only those of `action` if given), oldest first, with their decoded detail.

        Keyed by the job's cluster uid and owner (a later cluster of the same name, or a reused job id,
        never sees them)."""
        row = session.get(Cluster, job.cluster_id)
        if row is None:
            return []
        query = (
            select(Event)
            .where(
                Event.cluster_uid == row.uid,
                Event.owner_id == job.owner_id,
                Event.action.startswith(JOB_EVENTS) if action is None else Event.action == action.value,
            )
            .order_by(Event.id)
        )
        found = [(event, json.loads(event.detail or "{}")) for event in session.scalars(query)]
        return [(event, detail) for event, detail in found if detail.get("job") == job.id]

    @staticmethod
    def _add_job_event(
        session: Session, job: Job, actor: str, action: EventAction, detail: dict[str, Any]
    ) -> None:
        """Record an event of `job` in its cluster's trail (``detail`` gains the job id)."""
        cluster = session.get(Cluster, job.cluster_id)
        add_event(session, actor, action, cluster.name if cluster else "", job.owner_id, **detail, job=job.id)

    def _authenticated(self, session: Session, job_id: int, token: str) -> Job:
        """The job whose report token `token` is; 429 past its report rate (--report-rate)."""
        job = session.get(Job, job_id)
        if job is None or not token or job.report_token_hash != hash_token(token):
            raise Unauthorized("unknown job or wrong report token (ELASTRAIN_REPORT_TOKEN)")
        if not self.reports.allow(job_id):
            raise TooMany(
                f"job {job_id} reports more than {self.reports.rate:g} times a second; report less often"
            )
        return job

    @staticmethod
    def _record(session: Session, job: Job, report: dict[str, object]) -> None:
        values = {k: v for k, v in report.items() if k in FIELDS and v is not None}
        scalars = report.get("scalars")
        if not values and not scalars:
            return
        for key, value in values.items():
            setattr(job, key, value)
        session.add(JobMetric(job_id=job.id, scalars=json.dumps(scalars) if scalars else None, **values))

    @staticmethod
    def _alive(job: Job) -> bool:
        """The job's process (jobrun for submitted jobs, ``elastrain run`` for attached ones) is running."""
        argv = cmdline(job.pid or 0) if job.pid and pid_alive(job.pid) else []
        return any("elastrain" in part for part in argv)

    def poll(self) -> int:
        """Update running jobs: progress scraped from new log lines; when a job's command is no longer
        running, its end judged (`job_recovery.judge`): finished, or started again (its launcher died
        under it, or it failed with retries left), or waiting for its launcher's replacement."""
        changed = 0
        self.files.begin_poll()
        with self.db.session() as session:
            names = {row.id: row.name for row in session.execute(select(Cluster.id, Cluster.name))}
            for job in session.scalars(select(Job).where(Job.status == JobStatus.Running)):
                cluster = names.get(job.cluster_id, "?")
                self._scrape(session, cluster, job)
                if self._alive(job):
                    self._gone_since.pop(job.id, None)
                    continue
                exit_code = self.files.exit_code(cluster, job.id, Path(job.log_path).with_suffix(".exit"))
                row = session.get(Cluster, job.cluster_id)
                launcher = launcher_of(row) if row is not None else None
                gone_for = 0.0 if exit_code is not None else self._gone_for(job.id)
                seen = recovery.launcher_seen(job.launcher_pid, row, launcher, exit_code, gone_for)
                attempts = recovery.Attempts(
                    job.platform_restarts or 0,
                    job.max_platform_restarts or 0,
                    job.user_restarts or 0,
                    job.max_user_restarts or 0,
                )
                verdict = recovery.judge(exit_code, seen, attempts)
                if verdict.outcome == recovery.Outcome.wait:
                    continue
                if verdict.outcome == recovery.Outcome.restart and row is not None and launcher is not None:
                    self._restart(session, row, launcher, job, verdict)
                    changed += 1
                    continue
                job.exit_code = exit_code
                job.status = JobStatus.Succeeded if exit_code == 0 else JobStatus.Failed
                job.finished_at = utcnow()
                self._offsets.pop(job.id, None)
                self._gone_since.pop(job.id, None)
                self.membership.forget(job.id)
                changed += 1
        self.files.end_poll()
        return changed

    def _gone_for(self, job_id: int) -> float:
        """Seconds since this server first saw job `job_id`'s command gone."""
        return time.monotonic() - self._gone_since.setdefault(job_id, time.monotonic())

    def _restart(
        self, session: Session, cluster: Cluster, launcher: Container, job: Job, verdict: recovery.Verdict
    ) -> None:
        """Start `job`'s command again in `launcher` (the `verdict` says why), counting it."""
        assert verdict.cause is not None
        Path(job.log_path).with_suffix(".exit").unlink(missing_ok=True)
        command = recovery.restart_command(json.loads(job.command), verdict.cause)
        if verdict.cause == recovery.Cause.platform:
            job.platform_restarts = (job.platform_restarts or 0) + 1
        else:
            job.user_restarts = (job.user_restarts or 0) + 1
        self._gone_since.pop(job.id, None)
        try:
            self._start(cluster, launcher, job, command, self.commands.spec(cluster, launcher))
        except (OSError, ElastrainError) as exc:  # counted: a launcher that cannot start it uses the budget
            log.warning("job %d: cannot start it again in %s: %s", job.id, launcher.name, exc)
            return
        detail = {"cause": verdict.cause.value, "reason": verdict.reason, "command": command}
        self._add_job_event(session, job, ACTOR, EventAction.job_restarted, detail)

    def _scrape(self, session: Session, cluster: str, job: Job) -> None:
        piece = self.files.new_log(cluster, job.id, Path(job.log_path), self._offsets.get(job.id, 0))
        if piece is None:
            return
        cut = piece.data.rfind(b"\n") + 1
        if not cut and len(piece.data) >= LOG_LIMIT:  # no line end in a whole window: no progress line
            cut = len(piece.data)
        self._offsets[job.id] = piece.offset + cut
        self._record(session, job, progress_values(piece.data[:cut].decode(errors="replace")))
