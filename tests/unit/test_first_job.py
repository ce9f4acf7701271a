"""The first job a fresh cluster suggests: `elastrain cluster create` prints it as the next step, and
that printed line is a working `elastrain job submit` of the shipped example with ``-np`` = the
hostfile's slots, or for an elastic cluster ``--min-np A --max-np B`` = the slots at its bounds (the
portal's job box holds the same command, the API's `first_job`: tests/browser/test_first_job.py), and
the cluster's "Run training" hint has the same worker count or range."""

from __future__ import annotations

import shlex
from typing import Any

import pytest

from elastrain.cli.main import main
from elastrain.client import ClusterInfo
from elastrain.db.models import Framework
from elastrain.examples import FIRST_JOB_MODULE, first_job_command, hostfile_slots, np_flags
from elastrain.server.cluster_views import launch_commands


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
            min_containers=kwargs["min_containers"] or kwargs["containers"],
            max_containers=kwargs["max_containers"] or kwargs["containers"],
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


def test_an_elastic_cluster_suggests_the_range_of_its_bounds() -> None:
    assert np_flags(2, 0, 4) == "--min-np 2 --max-np 4" and np_flags(2, 1, 2) == "-np 2"
    assert np_flags(2, 2, 3) == "--min-np 4 --max-np 6"  # slots: containers x GPUs per container
    assert first_job_command(2, 0, 4) == (
        "elastrain run --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile python -m " + FIRST_JOB_MODULE
    )


@pytest.mark.parametrize("framework", [Framework.horovod, Framework.pytorch])
@pytest.mark.parametrize(("low", "high", "gpus"), [(2, 4, 1), (4, 4, 0), (2, 3, 2)])
def test_the_run_training_hint_and_the_first_job_agree(
    framework: Framework, low: int, high: int, gpus: int
) -> None:
    hint, first_job = launch_commands(framework, low, high, gpus)
    flags = np_flags(low, gpus, high)
    assert f" {flags} --hostfile /etc/mpi/hostfile " in hint
    assert first_job == first_job_command(low, gpus, high) and f" {flags} " in first_job
    # a 4-container cluster never says -np 2 in one place and -np 4 in the other (issue 28)
    assert hint.split(" --hostfile")[0].endswith(
        first_job.split(" --hostfile")[0].removeprefix("elastrain run")
    )


@pytest.mark.parametrize(
    ("flags", "np"),
    [
        ([], "-np 2"),
        (["--containers", "3", "--gpus-per-container", "2"], "-np 6"),
        (["--min-containers", "2", "--max-containers", "4"], "--min-np 2 --max-np 4"),
    ],
)
def test_cluster_create_prints_the_first_job_and_that_line_submits_it(
    fake_client: type[FakeClient], capsys: pytest.CaptureFixture[str], flags: list[str], np: int
) -> None:
    assert main(["cluster", "create", "pc", "--framework", "pytorch", *flags]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("cluster pc created: 1 launcher + ")
    prefix = "next, its first job: "
    assert out[1] == (
        f"{prefix}elastrain job submit pc -- elastrain run {np} --hostfile /etc/mpi/hostfile "
        "python -m elastrain.examples.first_job"
    )

    # the printed line, pasted into a shell, submits exactly that command to that cluster
    argv = shlex.split(out[1].removeprefix(prefix))
    assert argv[0] == "elastrain"
    assert main(argv[1:]) == 0
    assert fake_client.calls[-1] == ("submit", ("pc", argv[argv.index("--") + 1 :]))
    assert argv[argv.index("--") + 1 :] == shlex.split(
        f"elastrain run {np} --hostfile /etc/mpi/hostfile python -m {FIRST_JOB_MODULE}"
    )
