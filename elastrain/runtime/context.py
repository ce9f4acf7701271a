"""The worker's launch context: the runtime's reader of `elastrain.contracts.env`'s ``ELASTRAIN_*``."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from elastrain.contracts.env import WorkerEnv, WorkerIdentity


@dataclass(frozen=True)
class LaunchContext:
    """How this worker was launched. `coordinator` is empty when run as a plain script (world of 1)."""

    coordinator: str = ""
    token: str = ""
    worker_id: str = "standalone"
    host: str = "127.0.0.1"
    local_rank: int = 0
    ledger_dir: Path | None = None
    run_id: str = ""
    backend: str = ""
    collective_timeout_s: float = 60.0
    bucket_bytes: int = 2 * 1024 * 1024  # gradient bucket size (ELASTRAIN_BUCKET_BYTES)
    heartbeat_s: float = 1.0
    coordinator_timeout_s: float = 30.0
    checkpoint_dir: Path | None = None
    checkpoint_every_steps: int | None = None
    checkpoint_every_seconds: float | None = None
    checkpoint_keep: int = 3
    resume_from: Path | None = None  # resolved by the launcher: a verified checkpoint, or None

    @property
    def managed(self) -> bool:
        """True when launched by `elastrain run` (a coordinator exists)."""
        return bool(self.coordinator)

    @classmethod
    def from_env(cls, environ: dict[str, str] | None = None) -> LaunchContext:
        """Read the context from the environment the agent set."""
        env = dict(os.environ if environ is None else environ)
        ledger = env.get(WorkerEnv.LEDGER_DIR, "")
        ckpt = env.get(WorkerEnv.CHECKPOINT_DIR, "")
        every = env.get(WorkerEnv.CHECKPOINT_EVERY, "")
        interval = env.get(WorkerEnv.CHECKPOINT_INTERVAL, "")
        resume = env.get(WorkerEnv.RESUME_FROM, "")
        who = WorkerIdentity.from_env(env)
        return cls(
            coordinator=who.coordinator,
            token=who.token,
            worker_id=who.worker_id,
            host=who.host,
            local_rank=who.local_rank,
            ledger_dir=Path(ledger) if ledger else None,
            run_id=env.get(WorkerEnv.RUN_ID, ""),
            backend=env.get(WorkerEnv.BACKEND, ""),
            collective_timeout_s=float(env.get(WorkerEnv.COLLECTIVE_TIMEOUT, "60")),
            bucket_bytes=int(env.get(WorkerEnv.BUCKET_BYTES, str(2 * 1024 * 1024))),
            heartbeat_s=float(env.get(WorkerEnv.HEARTBEAT_INTERVAL, "1")),
            coordinator_timeout_s=float(env.get(WorkerEnv.COORDINATOR_TIMEOUT, "30")),
            checkpoint_dir=Path(ckpt) if ckpt else None,
            checkpoint_every_steps=int(every) if every else None,
            checkpoint_every_seconds=float(interval) if interval else None,
            checkpoint_keep=int(env.get(WorkerEnv.CHECKPOINT_KEEP, "3")),
            resume_from=Path(resume) if resume else None,
        )
