"""Run platform faults on a fresh `PlatformCluster` and judge the whole: the job finished, every epoch
consumed every sample exactly once (the sample ledger), no orphaned container, the database sound.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from elastrain.chaos.platform import PlatformFault, PlatformFaultKind
from elastrain.chaos.platform_faults import FaultFigures, Injector, integrity
from elastrain.chaos.platform_plane import SAMPLES, PlatformCluster
from elastrain.report import build_report

LAUNCHER_LOSSES = {PlatformFaultKind.KILL_LAUNCHER, PlatformFaultKind.REBOOT}


def run_faults(
    faults: Sequence[PlatformFault], workdir: Path, epochs: int = 10, log: TextIO = sys.stderr
) -> dict[str, Any]:
    """Inject `faults` in order into one job on a fresh cluster in `workdir`; returns the figures of
    each fault and the totals (`passed` when the job succeeded with 0 duplicated, 0 missing, 0 orphaned
    and a sound database). Everything started is removed, also on failure."""

    def say(text: str) -> None:
        print(f"chaos: {text}", file=log, flush=True)

    pc = PlatformCluster(workdir, epochs=epochs)
    figures: list[FaultFigures] = []
    result: dict[str, Any] = {}
    try:
        # each launcher loss restarts the job once: the budget covers the schedule's, and 3 more
        launcher_losses = sum(f.kind in LAUNCHER_LOSSES for f in faults)
        job = pc.start(max_platform_restarts=launcher_losses + 3)
        say(f"job {job['id']} submitted on a 3-container cluster (server {pc.key})")
        injector = Injector(pc, say)
        try:
            for fault in faults:
                figures.append(injector.inject(fault))
        except Exception as exc:  # the figures so far, and what went wrong, are the result
            say(f"fault {len(figures) + 1} of {len(faults)} failed: {type(exc).__name__}: {exc}")
            result["error"] = f"fault {len(figures) + 1} ({faults[len(figures)].kind.value}): {exc}"
        pc.full_speed()
        done = pc.wait_end()
        orphans = pc.orphans()
        report = build_report(pc.ledger, SAMPLES)
        epochs_seen = report["epochs"]
        result |= {
            "faults": [f.as_dict() for f in figures],
            "job_status": done["status"],
            "exit_code": done["exit_code"],
            "platform_restarts": done["platform_restarts"],
            "duplicated": sum(e["duplicates"] for e in epochs_seen),
            "missing": sum(e["missing"] for e in epochs_seen) + SAMPLES * max(0, epochs - len(epochs_seen)),
            "orphaned": len(orphans),
            "lost_containers": pc.lost(),
            "database": integrity(pc.plane.data / "elastrain.db"),
            "generations": [(g["world_size"], g["cause"]) for g in report["generations"]],
        }
        if done["status"] != "Succeeded":
            result["log_tail"] = pc.log_tail()
    finally:
        left = pc.stop()
        result["left_after_cleanup"] = left
    result["passed"] = (
        "error" not in result
        and result.get("job_status") == "Succeeded"
        and result["duplicated"] == 0
        and result["missing"] == 0
        and result["orphaned"] == 0
        and not result["lost_containers"]
        and not any(f["notes"].get("server_errors") for f in result["faults"])
        and result["database"] == "ok"
        and not left
    )
    return result
