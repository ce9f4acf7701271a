"""Plain-text tables for the CLI's list commands."""

from __future__ import annotations


def format_table(rows: list[list[str]]) -> str:
    """`rows` (the first one the header) as left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows)
