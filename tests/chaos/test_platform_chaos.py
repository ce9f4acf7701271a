"""Platform chaos on the container backend: each scenario injects its fault into a 3-container cluster
running an elastic job (`elastrain run --min-np 2 --max-np 4`) and the job still ends Succeeded with
every sample of every epoch once, no orphaned container and a sound database. Skips without podman."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from elastrain.chaos.platform import PLATFORM_SCENARIOS, PlatformFault
from elastrain.chaos.platform_plane import PlatformUnavailable
from elastrain.chaos.platform_runner import run_faults

pytestmark = pytest.mark.timeout(600)


def _run(
    image: str, tmp_path: Path, faults: tuple[PlatformFault, ...] | list[PlatformFault]
) -> dict[str, Any]:
    assert image.startswith("localhost/elastrain-pytorch")
    log = io.StringIO()
    try:
        result = run_faults(faults, tmp_path / "chaos", log=log)
    except PlatformUnavailable as exc:  # not root: no tmpfs for the data directory
        pytest.skip(str(exc))
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
    # the replacement launcher adopts the running workers (coordinator_restart), or, when they gave up
    # waiting for it (the chaos job's heartbeat bound is 5 s; a loaded machine restarts the launcher
    # slower), the job resumes from its checkpoint (every 10 steps): either way it ends exactly once
    [fault] = result["faults"]
    adopted = "coordinator_restart" in {cause for _, cause in result["generations"]}
    assert adopted or fault["steps_lost"] <= 10, result


def test_network_cut_and_restored(image: str, tmp_path: Path) -> None:
    result = _run(image, tmp_path, PLATFORM_SCENARIOS["network-cut"].faults)
    [fault] = result["faults"]
    assert fault["detect_s"] is not None and fault["recover_s"] is not None, fault
    assert "heartbeat_loss" in {cause for _, cause in result["generations"]}, result


def test_server_killed_in_the_middle_of_a_scale(image: str, tmp_path: Path) -> None:
    result = _run(image, tmp_path, PLATFORM_SCENARIOS["server-kill-during-scale"].faults)
    [fault] = result["faults"]
    # the scale finished: 4 containers in the API and in podman, none twice, none lost
    assert (fault["notes"]["containers"], fault["notes"]["podman_containers"]) == (4, 4), fault
    assert result["generations"][-1][0] == 4, result


def test_reboot_every_container_stopped_and_the_server_restarted(image: str, tmp_path: Path) -> None:
    result = _run(image, tmp_path, PLATFORM_SCENARIOS["reboot"].faults)
    [fault] = result["faults"]
    assert fault["recover_s"] is not None and result["platform_restarts"] >= 1, result


def test_disk_full_reads_work_writes_answer_507_nothing_corrupt(image: str, tmp_path: Path) -> None:
    [fault] = _run(image, tmp_path, PLATFORM_SCENARIOS["disk-full"].faults)["faults"]
    notes = fault["notes"]
    assert notes["read_job_status"] == notes["read_after_steps"] == "Running", notes
    assert notes["read_clusters"] == 1, notes
    # writes that fit in the pages SQLite already holds are stored; the first that needs space is refused
    assert notes["write_statuses"][-1] == 507 and set(notes["write_statuses"]) <= {507}, notes
    assert notes["server_errors"] == 0, notes
    assert (notes["write_after"], notes["integrity"]) == ("ok", "ok"), notes
