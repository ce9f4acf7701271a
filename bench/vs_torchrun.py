"""elastrain vs torchrun on the same MLP, data and machine: overhead, resize pauses, failure recovery.

    .venv/bin/python bench/vs_torchrun.py --json artifacts/bench.json [--repeats 3] [--quick]
    .venv/bin/python bench/vs_torchrun.py --only steady --no-default --repeats 5   # the overhead alone

Per repeat, in this order (the two steady-state runs alternate which goes first):

1. steady state at world 2: ``elastrain run -np 2 -H 127.0.0.1:2`` and
   ``torchrun --standalone --nproc-per-node 2``, rank 0's median step interval over the same window;
2. an elastrain job (``--min-np 2 --max-np 3``, watched hostfile) driven through kill -9 of a worker
   at world 3, a host line added (2 -> 3) and a host line removed (3 -> 2);
3. the same events on torchrun agents (``--nnodes 1:3 --nproc-per-node 1``, c10d rendezvous, a third
   agent started later, SIGTERM to an agent), TUNED (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1,
   last_call_timeout=1);
4. the same events with torchrun's DEFAULT rendezvous settings when the remaining repeats still fit
   in --budget afterwards, else only its scale-out, else nothing (its runs mostly hang, and each
   hang costs a timeout).

torchrun events are triggered half-way between two of its checkpoints (every 100 steps), the
expected loss of an event at a random time. Every figure comes from the scripts' step logs and
elastrain's ledger. Ratios are against TUNED torchrun. The table shows median [min-max].
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import platform
import signal
import sys
import tempfile
import time
from dataclasses import replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

from jobs import ElastrainJob, StandaloneTorchrun, StaticElastrain, Timeouts, TorchrunJob
from proclib import kill_run
from scenarios import EVENTS, Plan, measure_steady, run_events
from summary import aggregate, format_breakdown, format_table, ratios

DEFAULT_EVENT_TIMEOUT_S = 40.0
SYSTEMS = ("elastrain", "torchrun_tuned", "torchrun_default")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--repeats", type=int, default=3, help="runs of each measurement (default 3)")
    p.add_argument("--quick", action="store_true", help="1 repeat, fewer steps (for iterating)")
    p.add_argument("--workdir", type=Path, help="keep logs here (default: a new temporary directory)")
    p.add_argument(
        "--budget",
        type=float,
        default=840.0,
        help="seconds; torchrun DEFAULT runs that would not fit are skipped (default 840)",
    )
    p.add_argument(
        "--deadline",
        type=float,
        default=880.0,
        help="seconds; a whole repeat that would end later is skipped (default 880, for a 15 min bound)",
    )
    p.add_argument("--no-default", action="store_true", help="skip torchrun with its default settings")
    p.add_argument(
        "--only",
        choices=["steady"],
        help="run only this measurement (steady: the two steady-state runs of each repeat)",
    )
    return p.parse_args(argv)


def _install_cleanup(run_id: str) -> None:
    """Whatever happens (exception, Ctrl-C, SIGTERM), kill every process this run started."""
    atexit.register(kill_run, run_id)

    def on_signal(signum: int, _frame: object) -> None:
        kill_run(run_id)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _say(text: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {text}", flush=True)


def _brief(record: dict[str, Any]) -> str:
    keys = ("step_s", "to_new_size_s", "pause_s", "steps_lost")
    figures = " ".join(
        f"{k}={record[k]:.3f}" if isinstance(record.get(k), float) else f"{k}={record[k]}"
        for k in keys
        if record.get(k) is not None
    )
    note = f" ({record['note']})" if record.get("note") else ""
    return (
        f"{record['measurement']}/{record['system']} r{record['repeat']}: {record['status']} {figures}{note}"
    )


def main(argv: list[str] | None = None) -> int:
    """Run every measurement, print the table, write the JSON."""
    args = parse_args(argv)
    repeats = 1 if args.quick else max(1, args.repeats)
    plan = Plan(warmup_steps=15, steady_window=60, after_steps=10) if args.quick else Plan()
    plan.timeouts = Timeouts(start_s=120.0, event_s=60.0, stop_s=30.0)
    run_id = f"vt{os.getpid()}-{int(time.time())}"
    _install_cleanup(run_id)
    work = args.workdir or Path(tempfile.mkdtemp(prefix="elastrain-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    load_before = os.getloadavg()
    _say(f"workdir {work}; {repeats} repeat(s){' (quick)' if args.quick else ''}; load {load_before[0]:.2f}")
    runs: list[dict[str, Any]] = []

    def record(items: list[dict[str, Any]]) -> None:
        for item in items:
            runs.append(item)
            _say(_brief(item))

    default_plan = replace(
        plan, stuck_s=15.0, timeouts=replace(plan.timeouts, event_s=DEFAULT_EVENT_TIMEOUT_S)
    )
    default_cost, main_cost = {"all": 240.0, "one": 110.0}, 0.0  # first estimates, then measured
    for r in range(repeats):
        if time.monotonic() - t0 + main_cost > args.deadline:
            _say(f"skipping repeat {r}: it would end after --deadline {args.deadline:.0f}s")
            runs.extend(
                {"measurement": m, "system": sys_, "repeat": r, "status": "skipped", "note": "--deadline"}
                for m, sys_ in [("steady", "elastrain"), ("steady", "torchrun")]
                + [(e, x) for e in (() if args.only else EVENTS) for x in SYSTEMS]
            )
            continue
        t_main = time.monotonic()
        steady = [
            lambda r=r: StaticElastrain(run_id, f"steady-elastrain-r{r}", work / f"steady-elastrain-r{r}"),
            lambda r=r: StandaloneTorchrun(run_id, f"steady-torchrun-r{r}", work / f"steady-torchrun-r{r}"),
        ]
        for make in steady if r % 2 == 0 else steady[::-1]:
            record([measure_steady(make(), plan, r)])
        if args.only == "steady":
            main_cost = time.monotonic() - t_main
            continue
        record(run_events("elastrain", lambda name: ElastrainJob(run_id, name, work / name), plan, r))
        tuned = lambda name: TorchrunJob(run_id, name, work / name, tuned=True)  # noqa: E731
        record(run_events("torchrun_tuned", tuned, plan, r))
        main_cost = time.monotonic() - t_main  # the latest repeat: the machine's load drifts
        if args.no_default:
            continue
        # torchrun's DEFAULT settings mostly hang and each hang costs a timeout: run every event when
        # the remaining required repeats still fit in the budget afterwards, else only the scale-out.
        left = args.budget - (time.monotonic() - t0) - (repeats - r - 1) * main_cost
        events = (
            EVENTS if left >= default_cost["all"] else ("scale_out",) if left >= default_cost["one"] else ()
        )
        for e in (e for e in EVENTS if e not in events):
            runs.append(
                {
                    "measurement": e,
                    "system": "torchrun_default",
                    "repeat": r,
                    "status": "skipped",
                    "note": f"time budget ({left:.0f}s to spare)",
                }
            )
        if len(events) < len(EVENTS):
            _say(f"torchrun DEFAULT repeat {r}: {left:.0f}s to spare, running {list(events) or 'nothing'}")
        if events:
            t_default = time.monotonic()
            default = lambda name: TorchrunJob(run_id, name, work / name, tuned=False)  # noqa: E731
            record(run_events("torchrun_default", default, default_plan, r, events))
            default_cost["all" if len(events) > 1 else "one"] = time.monotonic() - t_default
    leftover = kill_run(run_id)
    agg = aggregate(runs)
    headline = ratios(agg)
    wall = time.monotonic() - t0
    print()
    print(format_table(agg, headline))
    print()
    print(format_breakdown(agg))
    print(
        f"\nwall time {wall:.0f}s; load average {load_before[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
        f"{leftover} stray process(es) killed at the end; logs in {work}"
    )
    if args.json is not None:
        result = {
            **{k: v for k, v in headline.items()},
            "runs": runs,
            "summary": agg,
            "settings": {
                "repeats": repeats,
                "quick": args.quick,
                "only": args.only,
                "plan": {
                    "warmup_steps": plan.warmup_steps,
                    "steady_window": plan.steady_window,
                    "after_steps": plan.after_steps,
                    "checkpoint_every": plan.checkpoint_every,
                    "timeouts": vars(plan.timeouts),
                },
            },
            "environment": {
                "torch": version("torch"),
                "python": platform.python_version(),
                "cpus": os.cpu_count(),
                "load_before": load_before,
                "load_after": os.getloadavg(),
            },
            "wall_s": wall,
            "stray_processes_killed": leftover,
            "workdir": str(work),
        }
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2, default=str))
        print(f"results written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
