"""The environment a worker is started with: every ``ELASTRAIN_*`` name the runtime reads, once.

The launcher (`elastrain run`), the agent and the control plane write these variables; the worker's
`elastrain.runtime.context.LaunchContext` and `elastrain.runtime.progress` read them. Names are
`WorkerEnv` members (a `StrEnum`: each member *is* its variable name, usable as a dict key or with
``os.environ``). `WorkerIdentity` is the typed part the agent sets for each worker it spawns.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

ENV_VERSION = 1  # bump when a variable changes meaning or is removed


class WorkerEnv(enum.StrEnum):
    """The ``ELASTRAIN_*`` variables of a worker process (who sets each is in its comment)."""

    # the agent, per worker
    COORDINATOR = "ELASTRAIN_COORDINATOR"  # host:port of the coordinator; absent: a plain script
    JOB_TOKEN = "ELASTRAIN_JOB_TOKEN"  # the job's secret (coordinator channel, store prefix)
    WORKER_ID = "ELASTRAIN_WORKER_ID"
    HOST = "ELASTRAIN_HOST"  # the address this worker's host is known by in the job
    LOCAL_RANK = "ELASTRAIN_LOCAL_RANK"  # the slot on its host (picks the GPU)
    # the launcher, for every worker of the run
    RUN_ID = "ELASTRAIN_RUN_ID"
    LEDGER_DIR = "ELASTRAIN_LEDGER_DIR"
    COORDINATOR_TIMEOUT = "ELASTRAIN_COORDINATOR_TIMEOUT"  # seconds before a worker gives up (exit 3)
    COLLECTIVE_TIMEOUT = "ELASTRAIN_COLLECTIVE_TIMEOUT"  # seconds
    HEARTBEAT_INTERVAL = "ELASTRAIN_HEARTBEAT_INTERVAL"  # seconds
    BACKEND = "ELASTRAIN_BACKEND"  # gloo / nccl; empty: choose
    BUCKET_BYTES = "ELASTRAIN_BUCKET_BYTES"  # gradient bucket size
    # `elastrain run` checkpoint flags
    CHECKPOINT_DIR = "ELASTRAIN_CHECKPOINT_DIR"
    CHECKPOINT_EVERY = "ELASTRAIN_CHECKPOINT_EVERY"  # steps
    CHECKPOINT_INTERVAL = "ELASTRAIN_CHECKPOINT_INTERVAL"  # seconds
    CHECKPOINT_KEEP = "ELASTRAIN_CHECKPOINT_KEEP"
    RESUME_FROM = "ELASTRAIN_RESUME_FROM"  # a verified checkpoint the launcher resolved
    # the control plane (a job started by `elastrain job submit`)
    REPORT_URL = "ELASTRAIN_REPORT_URL"
    JOB_ID = "ELASTRAIN_JOB_ID"
    REPORT_TOKEN = "ELASTRAIN_REPORT_TOKEN"
    CONTAINER_ROOT = "ELASTRAIN_CONTAINER_ROOT"  # where the container's / is on the host


@dataclass(frozen=True)
class WorkerIdentity:
    """What the agent tells each worker it spawns: where the coordinator is and who the worker is."""

    coordinator: str
    token: str
    worker_id: str
    host: str
    local_rank: int

    def to_env(self) -> dict[str, str]:
        """The variables to add to the worker's environment."""
        return {
            WorkerEnv.COORDINATOR: self.coordinator,
            WorkerEnv.JOB_TOKEN: self.token,
            WorkerEnv.WORKER_ID: self.worker_id,
            WorkerEnv.HOST: self.host,
            WorkerEnv.LOCAL_RANK: str(self.local_rank),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WorkerIdentity:
        """Read it back (defaults: a standalone world of one)."""
        return cls(
            coordinator=env.get(WorkerEnv.COORDINATOR, ""),
            token=env.get(WorkerEnv.JOB_TOKEN, ""),
            worker_id=env.get(WorkerEnv.WORKER_ID, "standalone"),
            host=env.get(WorkerEnv.HOST, "127.0.0.1"),
            local_rank=int(env.get(WorkerEnv.LOCAL_RANK, env.get("LOCAL_RANK", "0"))),
        )


@dataclass(frozen=True)
class ReportEnv:
    """Where a control-plane job's rank 0 posts its reports (all empty outside such a job)."""

    url: str = ""
    job_id: str = ""
    token: str = ""

    def to_env(self) -> dict[str, str]:
        """The variables the control plane sets."""
        return {
            WorkerEnv.JOB_ID: self.job_id,
            WorkerEnv.REPORT_URL: self.url,
            WorkerEnv.REPORT_TOKEN: self.token,
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> ReportEnv:
        """Read it back."""
        return cls(
            url=env.get(WorkerEnv.REPORT_URL, ""),
            job_id=env.get(WorkerEnv.JOB_ID, ""),
            token=env.get(WorkerEnv.REPORT_TOKEN, ""),
        )

    def endpoint(self, resource: str) -> str:
        """URL of the job's `resource` (``progress``, ``incidents``); empty when not a control-plane job."""
        if not (self.url and self.job_id and self.token):
            return ""
        return f"{self.url.rstrip('/')}/api/v1/jobs/{self.job_id}/{resource}"
