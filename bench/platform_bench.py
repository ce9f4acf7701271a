"""`make bench-platform`: a slice of the shipped Philly trace through the real control plane, once with
``--scheduler static`` and once with the default (elastic), and the simulator on the same slice.

    python bench/platform_bench.py [--jobs 40] [--gpus 12] [--start-h 40] [--min-duration 300]
                             [--makespan 300] [--restart-cost 1] [--only static|elastic] [--json PATH]

Prints a table per policy (platform and simulator: average / p50 / max JCT, makespan, GPU-seconds
idle while some job waited, resizes) and, last, ``platform: jct_ratio=R idle_ratio=I
sim_jct_ratio=S`` (elastic / static on the platform: average JCT, idle-while-waiting GPU-seconds;
the simulator's elastic / static average JCT). The simulator's static is ``static-backfill``: the
platform without a scheduler starts every cluster whose whole size fits, in creation order, as that
policy does. Targets (issue 28): R <= 0.75, I <= 0.2, |R - S| / S <= 0.15; reported, not asserted.
See bench/README.md ("Platform") for the slice, the time compression and the work model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from platform_run import Replay, RunResult
from platform_trace import (
    bounds,
    compress,
    idle_while_waiting,
    mean,
    ratio,
    run_sim,
    select_slice,
    sim_config,
    sim_series,
    time_factor,
    with_floor,
    work_for,
)

from elastrain.errors import ConfigError
from elastrain.scheduler.metrics import percentile
from elastrain.scheduler.simulator import SimResult
from elastrain.scheduler.trace import read_trace

ROOT = Path(__file__).resolve().parent.parent
TRACE = "shared/traces/philly/philly_2017-10-09_48h.csv"
# the shared folder next to the checkout (a worktree may sit one level deeper)
DEFAULT_TRACE = next((p / TRACE for p in ROOT.parents if (p / TRACE).is_file()), ROOT.parent / TRACE)
SIM_POLICY = {"static": "static-backfill", "elastic": "elastic"}
TARGETS = {"jct_ratio": 0.75, "idle_ratio": 0.2, "sim_error": 0.15}


def row(name: str, jct: list[float], makespan: float, idle: float, resizes: int, extra: str = "") -> str:
    """One line of the table."""
    return (
        f"{name:18s} {mean(jct):8.1f} {percentile(jct, 50):8.1f} {max(jct, default=0.0):8.1f} "
        f"{makespan:9.1f} {idle:10.1f} {resizes:8d}  {extra}"
    )


COLUMNS = (
    ("avg JCT", 8),
    ("p50 JCT", 8),
    ("max JCT", 8),
    ("makespan", 9),
    ("idle GPU-s", 10),
    ("resizes", 8),
)
HEADER = " ".join([f"{'':18s}", *(f"{h:>{w}s}" for h, w in COLUMNS)])


def sim_row(mode: str, res: SimResult, gpus: int) -> tuple[str, float, float]:
    """The simulator's line for one policy; its average JCT and idle-while-waiting GPU-seconds."""
    idle = idle_while_waiting(sim_series(res), gpus, res.last_finish_s)
    span = res.last_finish_s - res.first_submit_s
    return row(f"sim {SIM_POLICY[mode]}", res.jct_s, span, idle, res.resizes), mean(res.jct_s), idle


def start_s(res: RunResult) -> float:
    """The average time from a job's submission to its first step on the platform."""
    return mean([i.first_step - i.submitted for i in res.jobs if i.first_step is not None and i.submitted])


def platform_row(res: RunResult, gpus: int) -> tuple[str, float, float]:
    """The platform's line for one run; its average JCT and idle-while-waiting GPU-seconds."""
    jct = [i.jct for i in res.jobs]
    idle = idle_while_waiting(res.series, gpus, res.end_s)
    failed = [i.cluster for i in res.jobs if i.status != "Succeeded"]
    extra = f"submit -> first step avg {start_s(res):.1f} s"
    if failed:
        extra += f"; not succeeded: {', '.join(failed)}"
    return row(f"platform {res.mode}", jct, res.end_s, idle, res.resizes, extra), mean(jct), idle


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--jobs", type=int, default=40, help="trace jobs in the slice")
    ap.add_argument("--gpus", type=int, default=12, help="the server's virtual GPUs (--gpus)")
    ap.add_argument("--start-h", type=float, default=40.0, help="the slice starts here (trace hours)")
    ap.add_argument("--min-duration", type=float, default=300.0, help="shortest trace run time kept (s)")
    ap.add_argument("--max-duration", type=float, default=6 * 3600.0, help="longest trace run time kept (s)")
    ap.add_argument("--makespan", type=float, default=300.0, help="static's simulated makespan (bench s)")
    ap.add_argument("--restart-cost", type=float, default=1.0, help="the simulator's stall per resize (s)")
    ap.add_argument("--deadline", type=float, default=1200.0, help="longest replay, per policy (s)")
    ap.add_argument("--only", choices=("static", "elastic"), help="replay one policy on the platform")
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument("--keep", type=Path, help="keep the servers' data dirs (job logs, events) here")
    args = ap.parse_args(argv)
    wall0 = time.monotonic()
    try:
        trace = select_slice(
            read_trace(args.trace),
            args.jobs,
            args.gpus,
            args.start_h * 3600.0,
            args.min_duration,
            args.max_duration,
        )
    except ConfigError as exc:
        print(f"bench-platform: {exc}", file=sys.stderr)
        return 2
    trace = with_floor(trace)
    config = sim_config(args.gpus, args.restart_cost)
    factor = time_factor(trace, args.makespan, config)
    jobs = compress(trace, factor)
    works = [work_for(j, args.gpus) for j in jobs]
    ranges = [bounds(j, args.gpus) for j in jobs]
    sizes = sorted({j.num_gpus for j in jobs})
    print(
        f"slice: {len(jobs)} jobs of {args.trace.name} from {args.start_h:g} h (sizes {sizes} GPUs), "
        f"time x{factor:.4f}: arrivals over {jobs[-1].submit_s:.0f} s, runs "
        f"{min(j.duration_s for j in jobs):.1f}-{max(j.duration_s for j in jobs):.1f} s; {args.gpus} GPUs",
        flush=True,
    )
    modes = [args.only] if args.only else ["static", "elastic"]
    lines, figures = [], {}
    for mode in ("static", "elastic"):
        line, avg, idle = sim_row(mode, run_sim(jobs, SIM_POLICY[mode], config), args.gpus)
        lines.append(line)
        figures[f"sim_{mode}"] = {"avg_jct_s": avg, "idle_gpu_s": idle}
    with tempfile.TemporaryDirectory(prefix="bench-platform-") as tmp_dir:
        tmp = args.keep or Path(tmp_dir)
        for mode in modes:
            print(f"platform run: --scheduler {mode}", flush=True)
            res = Replay(tmp, mode, args.gpus, jobs, works, ranges, deadline_s=args.deadline).run()
            line, avg, idle = platform_row(res, args.gpus)
            lines.append(line)
            figures[mode] = {"avg_jct_s": avg, "idle_gpu_s": idle, "makespan_s": res.end_s,
                             "start_s": start_s(res), "resizes": res.resizes,
                             "jobs": [i.record() for i in res.jobs]}  # fmt: skip
    print(HEADER)
    print("\n".join(lines))
    if "static" in figures:  # diagnostic: how much of the gap is the platform's job start
        extra = figures["static"]["start_s"]
        late = [replace(j, duration_s=j.duration_s + extra) for j in jobs]
        sims = {m: mean(run_sim(late, SIM_POLICY[m], config).jct_s) for m in ("static", "elastic")}
        figures["sim_with_start"] = {"start_s": extra, **sims}
        print(
            f"diagnostic: the simulator with each run time {extra:.1f} s longer (static's average submit -> "
            f"first step): elastic/static {ratio(sims['elastic'], sims['static']):.2f}"
        )
    s = ratio(figures["sim_elastic"]["avg_jct_s"], figures["sim_static"]["avg_jct_s"])
    wall = time.monotonic() - wall0
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"time_factor": factor, "wall_s": wall, **figures}, indent=2) + "\n")
    if len(modes) < 2:
        print(f"platform: only {modes[0]} replayed; sim_jct_ratio={s:.2f}")
        return 0
    r = ratio(figures["elastic"]["avg_jct_s"], figures["static"]["avg_jct_s"])
    i = ratio(figures["elastic"]["idle_gpu_s"], figures["static"]["idle_gpu_s"])
    err = abs(r - s) / s if s > 0 else float("inf")
    met = r <= TARGETS["jct_ratio"] and i <= TARGETS["idle_ratio"] and err <= TARGETS["sim_error"]
    print(
        f"targets: R <= {TARGETS['jct_ratio']}, I <= {TARGETS['idle_ratio']}, |R - S| / S = {err:.2f} <= "
        f"{TARGETS['sim_error']}: {'met' if met else 'NOT met'}; wall {wall:.0f} s"
    )
    print(f"platform: jct_ratio={r:.2f} idle_ratio={i:.2f} sim_jct_ratio={s:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
