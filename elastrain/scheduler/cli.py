"""``elastrain simulate``: replay a job trace through one or more policies and compare them."""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path
from typing import TextIO

from elastrain.cli.progress import StatusLine, TimedOut, format_elapsed, raise_after, timeout_seconds
from elastrain.errors import ConfigError
from elastrain.scheduler.api import ClusterState, Decision, Policy


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
    p.add_argument(
        "--timeout",
        type=timeout_seconds,
        metavar="SECONDS",
        help="stop after SECONDS of wall time (exit 1, nothing printed or written)",
    )


class ProgressBar:
    """One simulation's progress on the CLI's status line (stderr): a bar, the jobs done and, when
    `sim_clock` gives it, the simulated time. Redrawn in place (at most every 0.2 s) on a terminal;
    elsewhere a plain line per tenth of the jobs. `quiet`: count, draw nothing (``--no-progress``)."""

    def __init__(
        self,
        label: str,
        stream: TextIO | None = None,
        width: int = 30,
        *,
        sim_clock: Callable[[], float] | None = None,
        quiet: bool = False,
    ) -> None:
        self.label, self.width, self.sim_clock, self.quiet = label, width, sim_clock, quiet
        self.status = StatusLine(stream)
        self.done = self.total = 0
        self._last = 0.0

    def __call__(self, done: int, total: int) -> None:
        self.done, self.total = done, total
        now = time.monotonic()
        if self.quiet or (done < total and now - self._last < 0.2):
            return
        self._last = now
        frac = done / total if total else 1.0
        fill = int(frac * self.width)
        bar = "#" * fill + "." * (self.width - fill)
        self.status.update(f"{self.label:<10} [{bar}] {frac:6.1%} {self.where()}", key=f"{int(frac * 10)}")

    def where(self) -> str:
        """``120/500 jobs, simulated 3h12m``."""
        sim = f", simulated {format_elapsed(self.sim_clock())}" if self.sim_clock is not None else ""
        return f"{self.done}/{self.total} jobs{sim}"

    def close(self) -> None:
        """End the bar's line."""
        self.status.close()


class ClockedPolicy(Policy):
    """`inner`, noting the virtual time of each decision in `now_s`: the simulator's progress
    callback counts jobs only, and the status line shows the simulated time too."""

    def __init__(self, inner: Policy, start_s: float = 0.0) -> None:
        self.inner, self.start_s, self.now_s = inner, start_s, start_s

    def simulated_s(self) -> float:
        """Virtual seconds from `start_s` (the first submission) to the last decision."""
        return self.now_s - self.start_s

    def decide(self, state: ClusterState) -> list[Decision]:
        """`inner`'s decisions (the time noted first)."""
        self.now_s = state.now_s
        return self.inner.decide(state)

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        """`inner`'s next wakeup."""
        return self.inner.next_wakeup_s(state)


def clocked(policy: Policy, start_s: float = 0.0) -> ClockedPolicy:
    """`policy` behind a `ClockedPolicy` that keeps its name (the results are reported under it)."""
    named = type(f"Clocked{type(policy).__name__}", (ClockedPolicy,), {"name": policy.name})
    wrapper: ClockedPolicy = named(policy, start_s)
    return wrapper


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run the simulations, print the table, write the JSON and the plot."""
    from elastrain.scheduler.metrics import format_table, write_json
    from elastrain.scheduler.registry import make_policy
    from elastrain.scheduler.simulator import SimConfig, SimResult, simulate
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

        def benchmark_timed_out() -> TimedOut:
            return TimedOut(
                f"simulate timed out after {args.timeout:g}s on benchmark {args.benchmark} "
                "(nothing printed or written): give a larger --timeout, fewer policies or one --workload"
            )

        with raise_after(args.timeout, benchmark_timed_out):
            return cmd_benchmark(args, names)
    jobs = repeat_trace(read_trace(args.trace), args.repeat)
    config = SimConfig(
        gpus=args.gpus,
        gpus_per_node=args.gpus_per_node,
        interval_s=args.interval,
        restart_cost_s=args.restart_cost,
        max_gpus_default=args.max_gpus_default,
    )
    results: list[SimResult] = []
    first_submit = min((j.submit_s for j in jobs), default=0.0)
    bar = ProgressBar("", quiet=True)

    def timed_out() -> TimedOut:
        left = [p.name for p in policies[len(results) + 1 :]]
        return TimedOut(
            f"simulate timed out after {args.timeout:g}s: policy {bar.label} at {bar.where()}"
            f"{'; not run: ' + ', '.join(left) if left else ''} (nothing printed or written): give a "
            "larger --timeout, fewer policies or a shorter trace"
        )

    with raise_after(args.timeout, timed_out):
        for policy in policies:
            watched = clocked(policy, first_submit)
            bar = ProgressBar(policy.name, sim_clock=watched.simulated_s, quiet=args.no_progress)
            try:
                results.append(simulate(jobs, watched, config, progress=bar))
            finally:
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
