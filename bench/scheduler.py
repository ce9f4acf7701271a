"""Scheduler benchmark: every policy on the shared Philly window at 32, 64 and 128 GPUs.

    python bench/scheduler.py [--trace CSV] [--gpus 32,64,128] [--policies ...] [--json PATH] [--jobs N]

Prints one table per cluster size (avg/p50/p99 JCT, waiting time, slowdown, utilisation, resizes,
preemptions, simulation time) and the elastic/tiresias ratios against the issue's targets
(avg JCT <= 0.70x the faithful Tiresias, p99 no worse; under 30 s of simulation per policy).
Runs are independent, so ``--jobs`` runs them in parallel processes.
"""

from __future__ import annotations

import argparse
import json
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from elastrain.scheduler.metrics import format_table, summarize
from elastrain.scheduler.registry import make_policy
from elastrain.scheduler.simulator import SimConfig, SimResult, simulate
from elastrain.scheduler.trace import read_trace

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_TRACE = ROOT.parent / "shared/traces/philly/philly_2017-10-09_48h.csv"
POLICIES = ("static", "static-backfill", "tiresias", "elastic")
TARGET_RATIO, TIME_LIMIT_S = 0.70, 30.0


def run_one(trace: Path, policy: str, gpus: int) -> tuple[SimResult, float]:
    """One simulation; returns the result and its CPU seconds."""
    res = simulate(read_trace(trace), make_policy(policy), SimConfig(gpus=gpus))
    return res, res.cpu_s


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", type=Path, default=DEFAULT_TRACE)
    ap.add_argument("--gpus", default="32,64,128")
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--json", type=Path, help="write {gpus: {policy: metrics}} here")
    ap.add_argument("--jobs", type=int, default=1, help="parallel simulations (processes)")
    args = ap.parse_args(argv)
    sizes = [int(g) for g in args.gpus.split(",")]
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    tasks = [(args.trace, p, g) for g in sizes for p in policies]
    if args.jobs > 1:
        with ProcessPoolExecutor(args.jobs) as pool:
            outs = list(pool.map(run_one, *zip(*tasks)))
    else:
        outs = [run_one(*t) for t in tasks]
    by_size: dict[int, list[tuple[SimResult, float]]] = {}
    for (_, _, g), out in zip(tasks, outs):
        by_size.setdefault(g, []).append(out)
    payload: dict[str, dict[str, dict[str, float | int]]] = {}
    ok = True
    print(f"trace {args.trace.name}")
    for g in sizes:
        results = [r for r, _ in by_size[g]]
        print(f"\n== {g} GPUs ==")
        print(format_table(results))
        cpu = {r.policy: c for r, c in by_size[g]}
        print("CPU s per policy: " + ", ".join(f"{p} {c:.1f}" for p, c in cpu.items()))
        summaries = {r.policy: {**summarize(r), "sim_cpu_s": cpu[r.policy]} for r in results}
        payload[str(g)] = summaries
        if "elastic" in summaries and "tiresias" in summaries:
            e, t = summaries["elastic"], summaries["tiresias"]
            avg, p99 = e["avg_jct_s"] / t["avg_jct_s"], e["p99_jct_s"] / t["p99_jct_s"]
            good = avg <= TARGET_RATIO and p99 <= 1.0
            ok &= good
            print(
                f"elastic/tiresias: avg JCT {avg:.2f} (target <= {TARGET_RATIO}), p99 {p99:.2f} (<= 1.00)"
                f" -> {'OK' if good else 'MISSED'}"
            )
        slow = [p for p, c in cpu.items() if c > TIME_LIMIT_S]
        if slow:
            ok = False
            print(f"over {TIME_LIMIT_S:.0f} s of simulation: {', '.join(slow)}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(payload, indent=2) + "\n")
    print("\nall targets met" if ok else "\nsome targets missed")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
