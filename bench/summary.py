"""From raw per-run records to medians/min/max, the headline ratios, and the printed table."""

from __future__ import annotations

import statistics
from typing import Any

from steplog import summarize

SYSTEMS = ("elastrain", "torchrun_tuned", "torchrun_default")
EVENT_FIGURES = ("to_new_size_s", "pause_s", "progress_regained_s", "steps_lost")
TABLE_FIGURES = ("to_new_size_s", "pause_s", "steps_lost")
EVENT_TITLES = {
    "scale_out": "scale-out 2->3",
    "failure": "kill -9 at world 3",
    "scale_in": "scale-in 3->2 (graceful)",
}
FIGURE_TITLES = {
    "to_new_size_s": "request -> first step at new size (s)",
    "pause_s": "longest gap between steps (s)",
    "progress_regained_s": "request -> first step beyond old max (s)",
    "steps_lost": "steps lost (redone)",
}


def _system(record: dict[str, Any]) -> str:
    """Steady-state torchrun runs are `torchrun` (standalone); events name the configuration."""
    return str(record["system"])


def aggregate(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Per measurement and system: status counts and summaries of every figure over the ok runs."""
    out: dict[str, Any] = {}
    for record in runs:
        key = f"{record['measurement']}/{_system(record)}"
        entry = out.setdefault(key, {"runs": 0, "ok": 0, "statuses": [], "values": {}})
        entry["runs"] += 1
        entry["statuses"].append(record.get("status"))
        if record.get("status") != "ok" or not record.get("ok", False):
            continue
        entry["ok"] += 1
        figures = ("step_s", "mean_step_s") if record["measurement"] == "steady" else EVENT_FIGURES
        for name in figures:
            if record.get(name) is not None:
                entry["values"].setdefault(name, []).append(float(record[name]))
        for part, info in (record.get("breakdown") or {}).items():
            if isinstance(info, dict) and "segments_s" in info:
                for seg, value in info["segments_s"].items():
                    entry["values"].setdefault(f"breakdown.{part}.{seg}", []).append(float(value))
                for mark, value in info["marks_s"].items():
                    entry["values"].setdefault(f"marks.{part}.{mark}", []).append(float(value))
    for entry in out.values():
        entry["figures"] = {name: summarize(vals) for name, vals in entry.pop("values").items()}
    return out


def _median(agg: dict[str, Any], key: str, figure: str) -> float | None:
    value = agg.get(key, {}).get("figures", {}).get(figure, {}).get("median")
    return None if value is None else float(value)


def _ratio(num: float | None, den: float | None) -> float | None:
    if num is None or den is None or den <= 0:
        return None
    return num / den


def ratios(agg: dict[str, Any]) -> dict[str, Any]:
    """The headline figures (ratios against TUNED torchrun) and the medians they come from."""
    e_step, t_step = _median(agg, "steady/elastrain", "step_s"), _median(agg, "steady/torchrun", "step_s")
    e_pause = _median(agg, "scale_out/elastrain", "pause_s")
    t_pause = _median(agg, "scale_out/torchrun_tuned", "pause_s")
    e_rec = _median(agg, "failure/elastrain", "to_new_size_s")
    t_rec = _median(agg, "failure/torchrun_tuned", "to_new_size_s")
    out: dict[str, Any] = {
        "overhead_ratio": _ratio(e_step, t_step),
        "scale_out_pause_ratio": _ratio(t_pause, e_pause),
        "recovery_ratio": _ratio(t_rec, e_rec),
        "elastrain_steps_lost": _median(agg, "failure/elastrain", "steps_lost"),
        "torchrun_steps_lost": _median(agg, "failure/torchrun_tuned", "steps_lost"),
        "scale_out_time_to_new_size_ratio": _ratio(
            _median(agg, "scale_out/torchrun_tuned", "to_new_size_s"),
            _median(agg, "scale_out/elastrain", "to_new_size_s"),
        ),
        "scale_in_pause_ratio": _ratio(
            _median(agg, "scale_in/torchrun_tuned", "pause_s"), _median(agg, "scale_in/elastrain", "pause_s")
        ),
        "scale_in_time_ratio": _ratio(
            _median(agg, "scale_in/torchrun_tuned", "to_new_size_s"),
            _median(agg, "scale_in/elastrain", "to_new_size_s"),
        ),
        "recovery_pause_ratio": _ratio(
            _median(agg, "failure/torchrun_tuned", "pause_s"), _median(agg, "failure/elastrain", "pause_s")
        ),
        "medians": {
            "elastrain_step_s": e_step,
            "torchrun_step_s": t_step,
            "elastrain_pause_s": e_pause,
            "torchrun_pause_s": t_pause,
            "elastrain_recover_s": e_rec,
            "torchrun_recover_s": t_rec,
        },
    }
    return out


def _cell(agg: dict[str, Any], key: str, figure: str, digits: int = 3) -> str:
    fig = agg.get(key, {}).get("figures", {}).get(figure)
    if not fig or fig.get("median") is None:
        return "-"
    if figure == "steps_lost":
        return f"{fig['median']:.0f} [{fig['min']:.0f}-{fig['max']:.0f}]"
    return f"{fig['median']:.{digits}f} [{fig['min']:.{digits}f}-{fig['max']:.{digits}f}]"


def _status_cell(agg: dict[str, Any], key: str) -> str:
    entry = agg.get(key)
    if not entry:
        return "-"
    bad = [s for s in entry["statuses"] if s != "ok"]
    return f"{entry['ok']}/{entry['runs']} ok" + (f" ({', '.join(bad)})" if bad else "")


def format_table(agg: dict[str, Any], headline: dict[str, Any]) -> str:
    """The table printed at the end: median [min-max] per figure, and the ratios."""
    width = (26, 40, 24, 24, 24)
    header = ("measurement", "figure", "elastrain", "torchrun tuned", "torchrun default")
    lines = ["".join(h.ljust(w) for h, w in zip(header, width)).rstrip(), "-" * sum(width)]

    def row(*cells: str) -> None:
        lines.append("".join(c.ljust(w) for c, w in zip(cells, width)).rstrip())

    row(
        "steady state, world 2",
        "median step time (s)",
        _cell(agg, "steady/elastrain", "step_s", 4),
        "standalone: " + _cell(agg, "steady/torchrun", "step_s", 4),
        "",
    )
    row(
        "",
        "mean step time (s)",
        _cell(agg, "steady/elastrain", "mean_step_s", 4),
        "standalone: " + _cell(agg, "steady/torchrun", "mean_step_s", 4),
        "",
    )
    row("", "runs", _status_cell(agg, "steady/elastrain"), _status_cell(agg, "steady/torchrun"), "")
    for event in ("scale_out", "failure", "scale_in"):
        title = EVENT_TITLES[event]
        for figure in TABLE_FIGURES:
            row(title, FIGURE_TITLES[figure], *(_cell(agg, f"{event}/{s}", figure, 2) for s in SYSTEMS))
            title = ""
        row("", "runs", *(_status_cell(agg, f"{event}/{s}") for s in SYSTEMS))
    lines.append("")
    names = (
        "overhead_ratio",
        "scale_out_pause_ratio",
        "recovery_ratio",
        "elastrain_steps_lost",
        "torchrun_steps_lost",
        "scale_out_time_to_new_size_ratio",
        "scale_in_pause_ratio",
        "scale_in_time_ratio",
        "recovery_pause_ratio",
    )
    for name in names:
        value = headline.get(name)
        lines.append(f"{name:34s} {'-' if value is None else f'{value:.3f}'}")
    return "\n".join(lines)


def format_breakdown(agg: dict[str, Any]) -> str:
    """Medians of the scale-out time-to-first-step breakdown (new worker and a survivor)."""
    lines = ["time to first step after a scale-out request, median seconds per segment:"]
    for system in SYSTEMS:
        figures = agg.get(f"scale_out/{system}", {}).get("figures", {})
        for part in ("new_worker", "survivor"):
            prefix = f"breakdown.{part}."
            segs = [(k[len(prefix) :], v["median"]) for k, v in figures.items() if k.startswith(prefix)]
            if not segs:
                continue
            total = sum(v for _, v in segs if v is not None)
            lines.append(f"  {system} {part} (sum {total:.2f}s):")
            largest = max(segs, key=lambda kv: kv[1] if kv[1] is not None else float("-inf"))[0]
            for seg, value in segs:
                flag = "   <- largest" if seg == largest else ""
                lines.append(f"    {seg:42s} {value:8.3f}{flag}")
    return "\n".join(lines)


def median_or_none(values: list[float]) -> float | None:
    """statistics.median, or None for no values."""
    return statistics.median(values) if values else None
