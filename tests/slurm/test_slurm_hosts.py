"""Slurm allocation -> hosts and slots, and the srun line (no cluster needed)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from elastrain.errors import ConfigError
from elastrain.launcher.hosts import SlurmHosts, StaticHosts, make_host_source
from elastrain.launcher.slurm import (
    allocation_slots,
    coordinator_host,
    expand_hostlist,
    parse_tasks_per_node,
    srun_command,
)


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("n1", ["n1"]),
        ("n[1-3,5]", ["n1", "n2", "n3", "n5"]),
        ("n[1-3,5],gpu[01-02]", ["n1", "n2", "n3", "n5", "gpu01", "gpu02"]),
        ("gpu[08-11]", ["gpu08", "gpu09", "gpu10", "gpu11"]),
        ("node[9-10]", ["node9", "node10"]),
        ("r[1-2]n[1-2]", ["r1n1", "r1n2", "r2n1", "r2n2"]),
        ("a,b-1,c[7]", ["a", "b-1", "c7"]),
        ("n[1-2],n2,n[2-3]", ["n1", "n2", "n3"]),
        ("host.example.org", ["host.example.org"]),
    ],
)
def test_expand_hostlist(expr: str, names: list[str]) -> None:
    assert expand_hostlist(expr) == names


@pytest.mark.parametrize("expr", ["n[1-3", "n1-3]", "n[3-1]", "n[a-b]", "n[1-2],m]"])
def test_expand_hostlist_refuses_malformed(expr: str) -> None:
    with pytest.raises(ConfigError, match="hostlist"):
        expand_hostlist(expr)


def test_expand_hostlist_matches_scontrol(tmp_path: Path) -> None:
    """Same names, same order as ``scontrol show hostnames`` (which needs only a minimal slurm.conf)."""
    expr = "n[1-3,5],gpu[01-02],r[1-2]n[7-8],n[07-10]"
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=hostlist\nSlurmctldHost=localhost\n")
    try:
        out = subprocess.run(
            ["scontrol", "show", "hostnames", expr],
            env={**os.environ, "SLURM_CONF": str(conf)},
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("scontrol is not installed")
    assert expand_hostlist(expr) == out.stdout.split()


def test_tasks_per_node() -> None:
    assert parse_tasks_per_node("2(x3),1", 4) == [2, 2, 2, 1]
    with pytest.raises(ConfigError, match="describes 2 nodes"):
        parse_tasks_per_node("1(x2)", 3)


@pytest.mark.parametrize(
    ("env", "slots"),
    [
        ({"SLURM_TASKS_PER_NODE": "1(x2)"}, {"n1": 1, "n2": 1}),
        ({"SLURM_TASKS_PER_NODE": "3,1"}, {"n1": 3, "n2": 1}),
        ({"SLURM_NTASKS_PER_NODE": "4", "SLURM_TASKS_PER_NODE": "4(x2)"}, {"n1": 4, "n2": 4}),
        ({"SLURM_NTASKS": "3"}, {"n1": 2, "n2": 1}),
        ({}, {"n1": 1, "n2": 1}),
    ],
)
def test_allocation_slots(env: dict[str, str], slots: dict[str, int]) -> None:
    assert allocation_slots({"SLURM_JOB_NODELIST": "n[1-2]", **env}) == slots


def test_nproc_per_node_overrides_the_allocation() -> None:
    env = {"SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "1(x2)"}
    assert allocation_slots(env, nproc_per_node=2) == {"n1": 2, "n2": 2}


def test_no_allocation_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="SLURM_JOB_NODELIST"):
        allocation_slots({})


def test_make_host_source_picks_slurm_inside_an_allocation(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "n[1-3]")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x3)")
    source = make_host_source(None, None, None, None, None)
    assert isinstance(source, SlurmHosts)
    assert source.read().slots_by_host() == {"n1": 2, "n2": 2, "n3": 2}
    # explicit hosts win over the allocation
    assert not isinstance(make_host_source("127.0.0.2:1", None, None, None, None), SlurmHosts)
    with pytest.raises(ConfigError, match="--slurm"):
        make_host_source("127.0.0.2:1", None, None, None, None, slurm=True)


def test_make_host_source_outside_slurm_is_local(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    source = make_host_source(None, None, None, None, 2)
    assert isinstance(source, StaticHosts) and not isinstance(source, SlurmHosts)


def test_srun_command_starts_one_agent_step_on_the_node() -> None:
    argv = srun_command(
        "n2", ["--coordinator", "10.0.0.1:5000", "--host", "n2", "--", "python", "t.py"], "py"
    )
    assert argv[0] == "srun"
    for flag in (
        "--nodes=1",
        "--ntasks=1",
        "--nodelist=n2",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--export=ALL",
    ):
        assert flag in argv
    assert argv[argv.index("py") :] == [
        "py", "-m", "elastrain.launcher.slurm", "--coordinator", "10.0.0.1:5000", "--host", "n2",
        "--", "python", "t.py",
    ]  # fmt: skip


def test_coordinator_host(monkeypatch: pytest.MonkeyPatch) -> None:
    assert coordinator_host("10.1.2.3", {}) == "10.1.2.3"
    assert coordinator_host("127.0.0.1", {"ELASTRAIN_COORDINATOR_HOST": "10.9.9.9"}) == "10.9.9.9"
    monkeypatch.setattr("elastrain.launcher.slurm.node_address", lambda node: "192.168.5.5")
    assert coordinator_host("127.0.0.1", {"SLURMD_NODENAME": "n1"}) == "192.168.5.5"
    monkeypatch.setattr("elastrain.launcher.slurm.node_address", lambda node: "127.0.0.1")
    assert coordinator_host("127.0.0.1", {"SLURMD_NODENAME": "n1"}) == "127.0.0.1"
