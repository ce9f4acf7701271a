"""Summary metrics of simulation runs: the JSON the checks read and the table the CLI prints."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from elastrain.scheduler.simulator import SimResult

METRIC_KEYS = (
    "avg_jct_s",
    "p50_jct_s",
    "p99_jct_s",
    "avg_queue_s",
    "avg_wait_s",
    "total_wait_s",
    "avg_slowdown",
    "p99_slowdown",
    "makespan_s",
    "gpu_utilization",
    "useful_utilization",
    "resizes",
    "preemptions",
    "jobs",
)


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile with linear interpolation (numpy's default); 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def summarize(res: SimResult) -> dict[str, float | int]:
    """The :data:`METRIC_KEYS` of one run.

    JCT = completion - submit; queueing delay = first start - submit; waiting time = all the time a
    job did not hold GPUs after its submission (before its first start *and* while preempted);
    slowdown = JCT / the trace's run time (jobs of a 0 s run time count as 1 s); makespan = last
    completion - first submit; GPU utilisation = allocated GPU-seconds / (cluster GPUs x makespan);
    useful-work utilisation = the trace's GPU-seconds of the finished jobs (duration x num_gpus, the
    work as the job ran it) / (cluster GPUs x makespan): allocated time lost to restarts, to
    preemption or to poorly scaling sizes does not count.
    """
    n = len(res.jct_s)
    makespan = max(0.0, res.last_finish_s - res.first_submit_s)
    capacity = res.gpus * makespan
    slow = [j / max(d, 1.0) for j, d in zip(res.jct_s, res.duration_s)]
    return {
        "avg_jct_s": sum(res.jct_s) / n if n else 0.0,
        "p50_jct_s": percentile(res.jct_s, 50.0),
        "p99_jct_s": percentile(res.jct_s, 99.0),
        "avg_queue_s": sum(res.queue_s) / n if n else 0.0,
        "avg_wait_s": sum(res.wait_s) / n if n else 0.0,
        "total_wait_s": sum(res.wait_s),
        "avg_slowdown": sum(slow) / len(slow) if slow else 0.0,
        "p99_slowdown": percentile(slow, 99.0),
        "makespan_s": makespan,
        "gpu_utilization": res.gpu_seconds / capacity if capacity > 0 else 0.0,
        "useful_utilization": res.work_gpu_seconds / capacity if capacity > 0 else 0.0,
        "resizes": res.resizes,
        "preemptions": res.preemptions,
        "jobs": n,
    }


def write_json(results: Sequence[SimResult], path: Path) -> None:
    """``{"<policy>": {metric: value, ...}, ...}`` to ``path``."""
    payload = {r.policy: summarize(r) for r in results}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=2) + "\n")


def format_table(results: Sequence[SimResult], baseline: str = "tiresias") -> str:
    """A fixed-width table, times in hours; avg/p99 JCT ratios against ``baseline`` (else ``static``)."""
    head = (
        f"{'policy':<16} {'jobs':>5} {'avg JCT h':>9} {'p50 h':>6} {'p99 JCT h':>9} {'avg wait h':>10} "
        f"{'slowdown':>8} {'makespan h':>10} {'GPU util':>8} {'useful':>6} {'resizes':>7} {'preempts':>8} "
        f"{'sim s':>6} {'cpu s':>6}"
    )
    lines = [head, "-" * len(head)]
    summaries = {r.policy: summarize(r) for r in results}
    for r in results:
        s = summaries[r.policy]
        lines.append(
            f"{r.policy:<16} {s['jobs']:>5} {s['avg_jct_s'] / 3600:>9.2f} {s['p50_jct_s'] / 3600:>6.2f} "
            f"{s['p99_jct_s'] / 3600:>9.1f} {s['avg_wait_s'] / 3600:>10.2f} {s['avg_slowdown']:>8.1f} "
            f"{s['makespan_s'] / 3600:>10.1f} {s['gpu_utilization']:>8.3f} {s['useful_utilization']:>6.3f} "
            f"{r.resizes:>7} {r.preemptions:>8} {r.wall_s:>6.1f} {r.cpu_s:>6.1f}"
        )
    name = baseline if baseline in summaries else "static"
    base = summaries.get(name)
    if base and base["avg_jct_s"] > 0 and base["p99_jct_s"] > 0:
        ratios = [
            f"{other}/{name} {s['avg_jct_s'] / base['avg_jct_s']:.2f} "
            f"(p99 {s['p99_jct_s'] / base['p99_jct_s']:.2f})"
            for other, s in summaries.items()
            if other != name
        ]
        if ratios:
            lines.append("avg JCT ratio: " + ", ".join(ratios))
    return "\n".join(lines)
