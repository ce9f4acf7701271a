"""SDK and CLI helpers that need no server: report_progress outside a job, mount resolution, rewriting."""

from __future__ import annotations

from pathlib import Path

import pytest

from elastrain.cli.cluster import resolve_mount
from elastrain.client import ClusterInfo, report_progress
from elastrain.errors import ConfigError
from elastrain.server.exec_service import rewrite_command


def test_report_progress_is_a_no_op_outside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in ("ELASTRAIN_REPORT_URL", "ELASTRAIN_JOB_ID", "ELASTRAIN_REPORT_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    assert report_progress(step=1) is False


def test_report_progress_survives_an_unreachable_server(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ELASTRAIN_REPORT_URL", "http://127.0.0.1:1")
    monkeypatch.setenv("ELASTRAIN_JOB_ID", "1")
    monkeypatch.setenv("ELASTRAIN_REPORT_TOKEN", "t")
    assert report_progress(step=1, loss=0.5) is False


def test_resolve_mount_makes_the_source_absolute(tmp_path: Path) -> None:
    assert resolve_mount("./data:/data", cwd=tmp_path) == f"{tmp_path / 'data'}:/data"
    assert resolve_mount("/abs/x:/x") == "/abs/x:/x"
    with pytest.raises(ConfigError, match="SRC:DST"):
        resolve_mount("nodest")


def test_rewrite_command_maps_hostfile_and_mounts() -> None:
    out = rewrite_command(
        [
            "elastrain",
            "run",
            "--hostfile",
            "/etc/mpi/hostfile",
            "python",
            "/data/train.py",
            "--out=/data/o",
            "sh -c 'ls /data'",
            "/database",
        ],
        Path("/root/c/etc/mpi/hostfile"),
        {"/data": Path("/root/c/data")},
    )
    assert out == [
        "elastrain",
        "run",
        "--hostfile",
        "/root/c/etc/mpi/hostfile",
        "python",
        "/root/c/data/train.py",
        "--out=/root/c/data/o",
        "sh -c 'ls /root/c/data'",
        "/database",
    ]


def test_cluster_info_summary_has_the_documented_shape() -> None:
    info = ClusterInfo.from_json(
        {
            "name": "c",
            "framework": "horovod",
            "state": "Running",
            "desired_containers": 2,
            "hostfile_generation": 3,
            "reason": "",
            "containers": [
                {
                    "name": "c-launcher",
                    "role": "launcher",
                    "address": "127.1.0.1",
                    "gpus": 1,
                    "gpu_ids": [0],
                    "state": "Running",
                    "reason": "",
                    "pid": 5,
                    "started_at": None,
                }
            ],
        }
    )
    summary = info.summary()
    assert {"name", "framework", "containers", "desired_containers", "hostfile_generation"} <= set(summary)
    assert {"name", "role", "address", "gpus", "state"} <= set(summary["containers"][0])
