"""Plain-text tables for the CLI's get/list commands (and the rows `-w` prints one at a time)."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from elastrain.client import ClusterInfo

CLUSTER_HEADER = ["NAME", "FRAMEWORK", "STATE", "CONTAINERS", "GENERATION"]


def format_table(rows: list[list[str]]) -> str:
    """`rows` (the first one the header) as left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return format_row_lines(rows, widths)


def format_row_lines(rows: list[list[str]], widths: list[int]) -> str:
    """`rows` padded to fixed `widths` (a longer cell pushes its row to the right, never truncated)."""
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)


def cluster_row(cluster: ClusterInfo, state: str | None = None) -> list[str]:
    """A cluster as one row under `CLUSTER_HEADER` (`state` overrides its state, e.g. ``Deleted``)."""
    return [
        cluster.name,
        cluster.framework,
        state or cluster.state,
        f"{len(cluster.running())}/{cluster.desired_containers}",
        str(cluster.hostfile_generation),
    ]
