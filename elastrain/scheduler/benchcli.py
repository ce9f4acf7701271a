"""``elastrain simulate --benchmark LIST``: the Pollux benchmark through the policies (see
:mod:`elastrain.scheduler.benchsim`); prints one table per workload (one workload) or the means
over the workloads (``--workload all``), with the reproduction check on ``pollux-1.0x``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from elastrain.errors import ConfigError


def cmd_benchmark(args: argparse.Namespace, names: list[str]) -> int:
    """Run the benchmark for the policies ``names`` as ``args`` say (flags validated by the caller)."""
    from elastrain.scheduler.benchmark import load_applications, read_benchmark
    from elastrain.scheduler.benchreport import format_means, mean_summary, reproduction_lines, run_workloads
    from elastrain.scheduler.cli import ProgressBar
    from elastrain.scheduler.metrics import format_table
    from elastrain.scheduler.simulator import SimConfig

    if args.repeat != 1:
        raise ConfigError("--repeat applies to --trace only")
    lists = read_benchmark(args.benchmark, args.bench_set, args.workload)
    if args.plot and len(lists) > 1:
        raise ConfigError("--plot needs one benchmark workload (--workload NAME)")
    app_dir: Path = args.app_data or args.benchmark.resolve().parent.parent / "pollux_throughput"
    if not app_dir.is_dir():
        raise ConfigError(f"no measurements folder {app_dir}: pass --app-data (the pollux_throughput folder)")
    apps = load_applications(app_dir, {j.application for jobs in lists.values() for j in jobs})
    config = SimConfig(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        interval_s=args.interval,
        restart_cost_s=args.restart_cost,
    )
    bars: list[ProgressBar] = []

    def progress(policy: str, workload: str) -> ProgressBar | None:
        while bars:
            bars.pop().close()
        if args.no_progress:
            return None
        bars.append(ProgressBar(f"{policy} {workload}"))
        return bars[-1]

    by_policy = run_workloads(
        lists, apps, names, config, args.batch_mode, args.tiresias_threshold, progress=progress
    )
    while bars:
        bars.pop().close()
    set_name = next(iter(lists.values()))[0].set_name
    print(
        f"benchmark {args.benchmark} ({', '.join(lists)}) on {args.gpus} GPUs, {args.gpus_per_node} per node"
    )
    means = {p: mean_summary(rs) for p, rs in by_policy.items()}
    if len(lists) == 1:
        print(format_table([rs[0] for rs in by_policy.values()]))
    else:
        for i, wl in enumerate(lists):
            row = ", ".join(f"{p} {mean_summary([rs[i]])['avg_jct_s']:.0f} s" for p, rs in by_policy.items())
            print(f"{wl}: avg JCT {row}")
        print(format_means(means, {p: sum(r.cpu_s for r in rs) for p, rs in by_policy.items()}))
    for line in reproduction_lines(means, list(lists), set_name):
        print(line)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(means, indent=2) + "\n")
    if args.plot:
        from elastrain.scheduler.plot import plot_results

        wl = next(iter(lists))
        plot_results([rs[0] for rs in by_policy.values()], args.plot, title=f"{wl} on {args.gpus} GPUs")
    return 0
