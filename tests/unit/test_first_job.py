"""The first job a fresh cluster suggests: `elastrain cluster create` prints it as the next step, and
that printed line is a working `elastrain job submit` of the shipped example with ``-np`` = the
hostfile's slots (the portal's job box holds the same command: tests/browser/test_first_job.py)."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from elastrain.cli.main import main
from elastrain.client import ClusterInfo
from elastrain.examples import FIRST_JOB_MODULE, first_job_command, hostfile_slots


class FakeClient:
    """Stands in for `elastrain.client.Client`: records what the CLI asked for."""

    calls: list[tuple[str, Any]] = []

    def __init__(self, url: str | None = None, token: str | None = None) -> None:
        pass

    def __enter__(self) -> FakeClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def create_cluster(self, name: str, **kwargs: Any) -> ClusterInfo:
        FakeClient.calls.append(("create", {"name": name, **kwargs}))
        return ClusterInfo(
            name=name,
            framework=kwargs["framework"],
            state="Pending",
            desired_containers=kwargs["containers"],
            hostfile_generation=0,
            containers=[],
            gpus_per_container=kwargs["gpus_per_container"],
        )

    def submit_job(self, cluster: str, command: list[str]) -> dict[str, Any]:
        FakeClient.calls.append(("submit", (cluster, command)))
        return {"id": 1, "cluster": cluster}


@pytest.fixture
def fake_client(monkeypatch: pytest.MonkeyPatch) -> type[FakeClient]:
    FakeClient.calls = []
    monkeypatch.setattr("elastrain.client.Client", FakeClient)
    return FakeClient


def test_hostfile_slots_are_containers_times_gpus_at_least_one() -> None:
    assert hostfile_slots(2, 0) == 2  # no GPUs: one slot per container, the launcher's included
    assert hostfile_slots(3, 1) == 3
    assert hostfile_slots(2, 4) == 8


def test_first_job_command_runs_the_shipped_example_on_every_slot() -> None:
    assert first_job_command(2) == (
        "elastrain run -np 2 --hostfile /etc/mpi/hostfile python -m elastrain.examples.first_job"
    )
    assert "-np 6 " in first_job_command(3, gpus_per_container=2)
    assert FIRST_JOB_MODULE == "elastrain.examples.first_job"


@pytest.mark.parametrize(("flags", "np"), [([], 2), (["--containers", "3", "--gpus-per-container", "2"], 6)])
def test_cluster_create_prints_the_first_job_and_that_line_submits_it(
    fake_client: type[FakeClient], capsys: pytest.CaptureFixture[str], flags: list[str], np: int
) -> None:
    assert main(["cluster", "create", "pc", "--framework", "pytorch", *flags]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cluster pc created: 1 launcher + ")
    prefix = "next, its first job: "
    assert out[1] == (
        f"{prefix}elastrain job submit pc -- elastrain run -np {np} --hostfile /etc/mpi/hostfile "
        "python -m elastrain.examples.first_job"
    )

    # the printed line, pasted into a shell, submits exactly that command to that cluster
    argv = shlex.split(out[1].removeprefix(prefix))
    assert argv[0] == "elastrain"
    assert main(argv[1:]) == 0
    assert fake_client.calls[-1] == ("submit", ("pc", shlex.split(first_job_command(np))))
