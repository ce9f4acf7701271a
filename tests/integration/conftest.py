"""Fixtures for multi-process tests: an ElasticJob factory that always cleans up."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from elastrain.hostfile import Host
from elastrain.testing.jobs import ElasticJob


@pytest.fixture(scope="session", autouse=True)
def _dataset() -> None:
    """Generate the MNIST-1D cache once per session (the workers then load it in milliseconds)."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import mnist1d_data

    mnist1d_data.load()


@pytest.fixture
def elastic_job(tmp_path: Path) -> Iterator[Callable[..., ElasticJob]]:
    """Start jobs with `elastic_job(hosts, run_args, command)`; every process is killed at the end."""
    jobs: list[ElasticJob] = []

    def start(
        initial_hosts: list[Host], run_args: list[str], command: list[str], name: str = "job"
    ) -> ElasticJob:
        workdir = tmp_path / name
        workdir.mkdir()
        job = ElasticJob(workdir, initial_hosts, run_args, command)
        jobs.append(job)
        return job

    yield start
    for job in jobs:
        job.cleanup()
