"""Benchmark mode over several workloads: run every policy on each, average the metrics, print them.

``elastrain simulate --benchmark LIST --workload all`` and ``bench/scheduler.py`` use these; the
averages have the same keys as :func:`elastrain.scheduler.metrics.summarize` (plus ``workloads``),
each the mean over the workloads of that workload's value (so ``avg_jct_s`` is the mean of the
workloads' average JCTs, as the Pollux paper reports it).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from elastrain.scheduler.benchmark import Application, BenchmarkJob
from elastrain.scheduler.benchsim import simulate_benchmark
from elastrain.scheduler.metrics import METRIC_KEYS, summarize
from elastrain.scheduler.simulator import ProgressFn, SimConfig, SimResult

# Published results on pollux-1.0x (16 nodes x 4 T4 GPUs): avg JCT in seconds (see
# ../shared/traces/pollux_benchmark/README.md).
PUBLISHED_WORKLOAD6_S = {"pollux": 2446.0, "tiresias": 3470.0, "optimus": 5302.0}
PUBLISHED_MEAN_S = {"pollux": 0.76 * 3600, "tiresias": 1.12 * 3600, "optimus": 1.58 * 3600}

Summary = dict[str, float | int]


def run_workloads(
    lists: Mapping[str, Sequence[BenchmarkJob]],
    apps: dict[str, Application],
    policies: Sequence[str],
    config: SimConfig,
    batch_mode: str = "auto",
    tiresias_threshold_gpu_h: float | None = None,
    progress: Callable[[str, str], ProgressFn | None] | None = None,
) -> dict[str, list[SimResult]]:
    """``{policy: [result per workload, in the order of lists]}``; ``progress(policy, workload)``
    may return a per-run progress callback."""
    out: dict[str, list[SimResult]] = {}
    for policy in policies:
        runs = []
        for name, jobs in lists.items():
            bar = progress(policy, name) if progress is not None else None
            runs.append(
                simulate_benchmark(jobs, apps, policy, config, batch_mode, tiresias_threshold_gpu_h, bar)
            )
        out[policy] = runs
    return out


def mean_summary(results: Sequence[SimResult]) -> Summary:
    """The mean of each metric over the runs (one per workload); ``workloads``: how many."""
    sums = [summarize(r) for r in results]
    if len(sums) == 1:
        return {**sums[0], "workloads": 1}
    out: Summary = {k: sum(s[k] for s in sums) / len(sums) for k in METRIC_KEYS} if sums else {}
    out["workloads"] = len(sums)
    return out


def format_means(
    summaries: Mapping[str, Summary], cpu_s: Mapping[str, float], baseline: str = "tiresias"
) -> str:
    """A fixed-width table of mean metrics per policy (times in hours), with avg JCT ratios to
    ``baseline`` and the seconds of CPU each policy took over all workloads."""
    head = (
        f"{'policy':<16} {'avg JCT h':>9} {'avg JCT s':>9} {'p99 JCT h':>9} {'avg wait h':>10} "
        f"{'slowdown':>8} {'makespan h':>10} {'GPU util':>8} {'useful':>6} {'resizes':>7} {'preempts':>8} "
        f"{'cpu s':>6}"
    )
    lines = [head, "-" * len(head)]
    for name, s in summaries.items():
        lines.append(
            f"{name:<16} {s['avg_jct_s'] / 3600:>9.3f} {s['avg_jct_s']:>9.0f} {s['p99_jct_s'] / 3600:>9.2f} "
            f"{s['avg_wait_s'] / 3600:>10.3f} {s['avg_slowdown']:>8.2f} {s['makespan_s'] / 3600:>10.2f} "
            f"{s['gpu_utilization']:>8.3f} {s['useful_utilization']:>6.3f} {s['resizes']:>7.0f} "
            f"{s['preemptions']:>8.0f} {cpu_s.get(name, 0.0):>6.1f}"
        )
    base = summaries.get(baseline)
    if base and base["avg_jct_s"] > 0:
        ratios = [
            f"{n}/{baseline} {s['avg_jct_s'] / base['avg_jct_s']:.2f}"
            for n, s in summaries.items()
            if n != baseline
        ]
        if ratios:
            lines.append("avg JCT ratio: " + ", ".join(ratios))
    return "\n".join(lines)


def reproduction_lines(
    summaries: Mapping[str, Summary], workloads: Sequence[str], set_name: str
) -> list[str]:
    """Our Tiresias against the published figure for this selection (workload-6, or the mean of the
    8 pollux-1.0x workloads), and elastic/tiresias against Pollux's published ratio."""
    if set_name != "pollux-1.0x":
        return []
    if list(workloads) == ["workload-6"]:
        published, what = PUBLISHED_WORKLOAD6_S, "workload-6"
    elif len(workloads) == 8:
        published, what = PUBLISHED_MEAN_S, "mean of 8 workloads"
    else:
        return []
    out = []
    tir = summaries.get("tiresias")
    if tir:
        dev = tir["avg_jct_s"] / published["tiresias"] - 1
        out.append(
            f"tiresias avg JCT ({what}): {tir['avg_jct_s']:.0f} s vs published {published['tiresias']:.0f} s "
            f"({dev:+.1%}; target within 10%)"
        )
    el = summaries.get("elastic")
    if tir and el and tir["avg_jct_s"] > 0:
        ratio = el["avg_jct_s"] / tir["avg_jct_s"]
        pub = published["pollux"] / published["tiresias"]
        out.append(
            f"elastic/tiresias avg JCT ({what}): {ratio:.2f} "
            f"(target <= 0.80; Pollux/Tiresias published {pub:.2f})"
        )
    return out
