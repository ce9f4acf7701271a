"""Summary metrics of simulation runs: the JSON the checks read and the table the CLI prints."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from elastrain.scheduler.simulator import SimResult

METRIC_KEYS = ("avg_jct_s", "p99_jct_s", "avg_queue_s", "makespan_s", "gpu_utilization", "jobs")


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation (numpy's default); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(res: SimResult) -> dict[str, float | int]:
    """``avg_jct_s, p99_jct_s, avg_queue_s, makespan_s, gpu_utilization, jobs`` of one run.

    JCT = completion - submit; queueing delay = first start - submit; makespan = last completion -
    first submit; GPU utilisation = allocated GPU-seconds / (cluster GPUs x makespan).
    """
    n = len(res.jct_s)
    makespan = max(0.0, res.last_finish_s - res.first_submit_s)
    return {
        "avg_jct_s": sum(res.jct_s) / n if n else 0.0,
        "p99_jct_s": percentile(res.jct_s, 99.0),
        "avg_queue_s": sum(res.queue_s) / n if n else 0.0,
        "makespan_s": makespan,
        "gpu_utilization": res.gpu_seconds / (res.gpus * makespan) if makespan > 0 else 0.0,
        "jobs": n,
    }


def write_json(results: Sequence[SimResult], path: Path) -> None:
    """``{"<policy>": {metric: value, ...}, ...}`` to ``path``."""
    payload = {r.policy: summarize(r) for r in results}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def format_table(results: Sequence[SimResult]) -> str:
    """A fixed-width table, times in hours; a JCT ratio line against ``static`` when present."""
    head = (
        f"{'policy':<10} {'jobs':>6} {'avg JCT h':>10} {'p99 JCT h':>10} {'avg queue h':>12} "
        f"{'makespan h':>11} {'GPU util':>9} {'resizes':>8} {'preempts':>9} {'sim s':>7}"
    )
    lines = [head, "-" * len(head)]
    summaries = {r.policy: summarize(r) for r in results}
    for r in results:
        s = summaries[r.policy]
        lines.append(
            f"{r.policy:<10} {s['jobs']:>6} {s['avg_jct_s'] / 3600:>10.2f} {s['p99_jct_s'] / 3600:>10.1f} "
            f"{s['avg_queue_s'] / 3600:>12.2f} {s['makespan_s'] / 3600:>11.1f} {s['gpu_utilization']:>9.3f} "
            f"{r.resizes:>8} {r.preemptions:>9} {r.wall_s:>7.1f}"
        )
    base = summaries.get("static")
    if base and base["avg_jct_s"] > 0:
        ratios = [
            f"{name}/static {s['avg_jct_s'] / base['avg_jct_s']:.2f}"
            for name, s in summaries.items()
            if name != "static"
        ]
        if ratios:
            lines.append("avg JCT ratio: " + ", ".join(ratios))
    return "\n".join(lines)
