"""Starting and, above all, reliably ending the benchmark's process trees (on `elastrain.testing`).

Every process a job starts gets ``BENCH_VS_TORCHRUN_TAG=<run id>/<job>`` in its environment, and
both launchers pass their environment down to agents and workers. elastrain starts agents and
workers in sessions of their own, so killing the launcher's process group is not enough: `Job.kill`
finds every process carrying the job's tag in /proc and SIGKILLs it by pid. `kill_run` does the
same for everything of this benchmark run (used at exit, on Ctrl-C and on SIGTERM).
"""

from __future__ import annotations

from pathlib import Path

from elastrain.testing.processes import Tagged, kill_env_tagged, pids_with_env

TAG_ENV = "BENCH_VS_TORCHRUN_TAG"


def tagged_pids(prefix: str) -> list[int]:
    """Pids of live processes whose tag starts with `prefix` (this process excluded)."""
    return pids_with_env(TAG_ENV, prefix)


def kill_run(run_id: str) -> int:
    """SIGKILL every process of benchmark run `run_id`; returns how many there were."""
    return kill_env_tagged(TAG_ENV, run_id + "/")


class Job(Tagged):
    """The processes of one launcher invocation (one job): started in new sessions, output to files."""

    def __init__(self, run_id: str, name: str, workdir: Path) -> None:
        super().__init__(TAG_ENV, f"{run_id}/{name}", workdir)
        self.name = name
