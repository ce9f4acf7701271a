"""``elastrain simulate``: replay a job trace through one or more policies and compare them."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import TextIO

from elastrain.errors import ConfigError


def add_simulate_command(sub: argparse._SubParsersAction) -> None:
    """Register the ``simulate`` subcommand on the CLI's subparsers."""
    p = sub.add_parser("simulate", help="replay a job trace through scheduling policies (virtual clock)")
    p.add_argument("--trace", type=Path, help="CSV with job_id,submit_time_s,num_gpus,duration_s")
    p.add_argument(
        "--benchmark",
        type=Path,
        help="Pollux benchmark list (set,workload,job_id,submit_time_s,application,num_gpus,batch_size) "
        "instead of --trace: jobs train their model's epochs at the measured goodput",
    )
    p.add_argument("--set", dest="bench_set", help="benchmark set in the list (default: the only one)")
    p.add_argument("--workload", default="all", help="benchmark workload, or all (default): their mean")
    p.add_argument(
        "--app-data",
        type=Path,
        help="folder with step_times.csv and grad_stats.csv (default: ../pollux_throughput beside the list)",
    )
    p.add_argument(
        "--batch-mode",
        default="auto",
        choices=("auto", "fixed", "adaptive"),
        help="benchmark batch sizes: fixed (the list's), adaptive (by goodput), auto (adaptive for elastic)",
    )
    p.add_argument("--gpus", type=int, required=True, help="GPUs in the simulated cluster")
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--policy", default="elastic", help="one policy: static, static-backfill, elastic or tiresias"
    )
    group.add_argument(
        "--compare",
        help="comma-separated policies to run and compare, e.g. static,static-backfill,elastic,tiresias",
    )
    p.add_argument("--json", type=Path, help="write {policy: metrics} as JSON here")
    p.add_argument("--plot", type=Path, help="write a PNG of GPUs in use and queue length over time")
    p.add_argument(
        "--gpus-per-node", type=int, default=0, help="GPUs per simulated node (default 8; 4 with --benchmark)"
    )
    p.add_argument("--repeat", type=int, default=1, help="replay the trace N times back to back (scale test)")
    p.add_argument(
        "--restart-cost",
        type=float,
        default=30.0,
        help="seconds without progress per resize/resume (default 30, the Pollux artifact's)",
    )
    p.add_argument(
        "--max-gpus-default",
        type=int,
        default=0,
        help="elastic max GPUs of a job whose trace has no max_gpus: max(num_gpus, this); 0: one node",
    )
    p.add_argument(
        "--tiresias-threshold",
        type=float,
        default=None,
        help="Tiresias queue threshold, GPU-hours of attained service (default 16, as in Pollux)",
    )
    p.add_argument("--interval", type=float, default=60.0, help="rescheduling grid for wakeups, seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")


class ProgressBar:
    """A one-line text progress bar on a stream, redrawn at most every 0.2 s."""

    def __init__(self, label: str, stream: TextIO | None = None, width: int = 30) -> None:
        # sys.stderr looked up now, not when the module was imported (tests swap it)
        self.label, self.stream, self.width = label, stream or sys.stderr, width
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.monotonic()
        if done < total and now - self._last < 0.2:
            return
        self._last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        bar = "#" * fill + "." * (self.width - fill)
        self.stream.write(f"\r{self.label:<10} [{bar}] {frac:6.1%} {done}/{total} jobs")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        self.stream.write("\n")
        self.stream.flush()


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run the simulations, print the table, write the JSON and the plot."""
    from elastrain.scheduler.metrics import format_table, write_json
    from elastrain.scheduler.registry import make_policy
    from elastrain.scheduler.simulator import SimConfig, simulate
    from elastrain.scheduler.trace import read_trace, repeat_trace

    if (args.trace is None) == (args.benchmark is None):
        raise ConfigError("give either --trace CSV or --benchmark CSV (one of them)")
    if args.gpus_per_node == 0:
        args.gpus_per_node = 4 if args.benchmark is not None else 8
    if args.gpus < 1 or args.gpus_per_node < 1:
        raise ConfigError("--gpus and --gpus-per-node must be >= 1")
    if args.restart_cost < 0 or args.interval <= 0 or args.max_gpus_default < 0:
        raise ConfigError("--restart-cost and --max-gpus-default must be >= 0 and --interval > 0")
    if args.tiresias_threshold is not None and args.tiresias_threshold <= 0:
        raise ConfigError("--tiresias-threshold must be > 0 GPU-hours")
    names = [n.strip() for n in (args.compare or args.policy).split(",") if n.strip()]
    if not names or len(set(names)) != len(names):
        raise ConfigError("give each policy once, e.g. --compare static,elastic,tiresias")
    policies = [make_policy(n, args.tiresias_threshold) for n in names]
    if args.benchmark is not None:
        from elastrain.scheduler.benchcli import cmd_benchmark

        return cmd_benchmark(args, names)
    jobs = repeat_trace(read_trace(args.trace), args.repeat)
    config = SimConfig(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        interval_s=args.interval,
        restart_cost_s=args.restart_cost,
        max_gpus_default=args.max_gpus_default,
    )
    results = []
    for policy in policies:
        bar = None if args.no_progress else ProgressBar(policy.name)
        results.append(simulate(jobs, policy, config, progress=bar))
        if bar is not None:
            bar.close()
    repeat = f", trace x{args.repeat}" if args.repeat > 1 else ""
    print(f"trace {args.trace} ({len(jobs)} jobs{repeat}) on {args.gpus} GPUs")
    print(format_table(results))
    if args.json:
        write_json(results, args.json)
    if args.plot:
        from elastrain.scheduler.plot import plot_results

        plot_results(results, args.plot, title=f"{args.trace.name} on {args.gpus} GPUs")
    return 0
