"""Measured latencies kept in ``artifacts/*_timings.json`` (one key per measurement, newest wins)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.testing.jobs import REPO

if TYPE_CHECKING:
    from elastrain.testing.server import ControlPlane

ARTIFACTS = REPO / "artifacts"
CONTROL_PLANE_TIMINGS = ARTIFACTS / "control_plane_timings.json"


def write_timing(path: Path, key: str, seconds: float) -> None:
    """Set `key` to `seconds` (3 decimals) in the JSON object at `path`, and print it (seen with -s)."""
    print(f"\ntiming: {key}: {seconds:.3f}s")
    path.parent.mkdir(exist_ok=True)
    try:
        timings = json.loads(path.read_text())
    except (OSError, ValueError):
        timings = {}
    timings[key] = round(seconds, 3)
    path.write_text(json.dumps(timings, indent=1, sort_keys=True) + "\n")


def record_timing(cp: ControlPlane, what: str, seconds: float) -> None:
    """Keep a control-plane latency in artifacts/control_plane_timings.json, keyed by its database."""
    write_timing(CONTROL_PLANE_TIMINGS, f"{what} [{'postgres' if cp.db_url else 'sqlite'}]", seconds)
