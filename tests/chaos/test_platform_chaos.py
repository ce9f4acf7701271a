"""Platform chaos on the container backend: each scenario injects its fault into a 3-container cluster
running an elastic job (`elastrain run --min-np 2 --max-np 4`) and the job still ends Succeeded with
every sample of every epoch once, no orphaned container and a sound database. Skips without podman."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from elastrain.chaos.platform import PLATFORM_SCENARIOS, PlatformFault
from elastrain.chaos.platform_runner import run_faults

pytestmark = pytest.mark.timeout(300)


def _run(
    image: str, tmp_path: Path, faults: tuple[PlatformFault, ...] | list[PlatformFault]
) -> dict[str, Any]:
    assert image.startswith("localhost/elastrain-pytorch")
    log = io.StringIO()
    result = run_faults(faults, tmp_path / "chaos", epochs=2, log=log)
    print(log.getvalue())  # the figures, for -s and for a failure's report
    assert result["passed"], (result, log.getvalue()[-3000:])
    assert (result["duplicated"], result["missing"], result["orphaned"]) == (0, 0, 0), result
    return result


def test_kill_worker_container(image: str, tmp_path: Path) -> None:
    [fault] = _run(image, tmp_path, PLATFORM_SCENARIOS["kill-worker"].faults)["faults"]
    assert fault["detect_s"] is not None and fault["recover_s"] is not None, fault
    assert fault["steps_lost"] <= 1, fault


def test_kill_launcher_container(image: str, tmp_path: Path) -> None:
    result = _run(image, tmp_path, PLATFORM_SCENARIOS["kill-launcher"].faults)
    assert result["platform_restarts"] == 1, result
    assert "coordinator_restart" in {cause for _, cause in result["generations"]}, result


def test_network_cut_and_restored(image: str, tmp_path: Path) -> None:
    result = _run(image, tmp_path, PLATFORM_SCENARIOS["network-cut"].faults)
    [fault] = result["faults"]
    assert fault["detect_s"] is not None and fault["recover_s"] is not None, fault
    assert "heartbeat_loss" in {cause for _, cause in result["generations"]}, result
