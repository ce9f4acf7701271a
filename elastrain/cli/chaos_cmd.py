"""`elastrain chaos`: run fault scenarios against the example job and report what held."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path

from elastrain.errors import ConfigError


def add_chaos_parser(sub: argparse._SubParsersAction) -> None:
    """Register `elastrain chaos`."""
    p = sub.add_parser("chaos", help="inject faults into the example job and check nothing is lost")
    p.add_argument(
        "--scenario",
        default="all",
        help="comma-separated: kill-worker, stop-worker, kill-agent, partition-host, kill-server, "
        "kill-coordinator, coordinator-gone, corrupt-checkpoint, kill-all-resume, fill-disk (or all); "
        "or soak: --faults random faults (seeded by --seed) in one long run",
    )
    p.add_argument("--faults", type=int, default=50, help="soak: how many random faults (default 50)")
    p.add_argument("--seed", type=int, help="soak: the schedule's seed (default: random, printed)")
    p.add_argument(
        "--platform",
        action="store_true",
        help="platform faults on a container-backend cluster (podman) running an elastic job: "
        "--list names them; SCENARIO runs one (or a comma-separated list, or all)",
    )
    p.add_argument("--list", action="store_true", help="with --platform: list the platform scenarios")
    p.add_argument(
        "--soak", type=int, metavar="N", help="with --platform: N random platform faults (--seed) in one job"
    )
    p.add_argument("name", nargs="?", metavar="SCENARIO", help="with --platform: the scenario(s) to run")
    p.add_argument("--json", type=Path, help="write the results here")
    p.add_argument("--workdir", type=Path, help="where the runs go (default: a temp dir)")


def cmd_chaos(args: argparse.Namespace) -> int:
    """Run the scenarios; exit 0 only when every one passed."""
    if args.platform or args.list or args.soak is not None or args.name:
        from elastrain.cli.chaos_platform import cmd_chaos_platform

        return cmd_chaos_platform(args)
    from elastrain.chaos.runner import ChaosRunner
    from elastrain.chaos.scenarios import parse_scenarios

    soak = args.scenario.strip() == "soak"
    scenarios = [] if soak else parse_scenarios(args.scenario)
    if args.faults < 1:
        raise ConfigError(f"--faults must be >= 1, got {args.faults}")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="elastrain-chaos-"))
    runner = ChaosRunner(workdir)
    from elastrain.chaos.runner import ChaosSkipped

    results = {}
    if soak:
        from elastrain.chaos.soak import run_soak

        seed = args.seed if args.seed is not None else random.randrange(1 << 31)
        print(f"chaos: soak with seed {seed} (rerun: --scenario soak --faults {args.faults} --seed {seed})")
        results["soak"] = run_soak(runner, args.faults, seed)
    for scenario in scenarios:
        try:
            results[scenario.name] = runner.run(scenario)
        except ChaosSkipped as exc:
            print(f"chaos: {scenario.name} skipped: {exc}")
    print(
        f"{'scenario':<20} {'passed':<7} {'detect_s':>8} {'recover_s':>9} {'lost':>5} {'dup':>4} {'miss':>5} "
        f"{'param_diff':>10}"
    )
    for name, r in results.items():
        detect = "-" if r["detect_s"] is None else f"{r['detect_s']:.2f}"
        recover = "-" if r["recover_s"] is None else f"{r['recover_s']:.2f}"
        counts = f"{r['steps_lost']:>5} {r['duplicates']:>4} {r['missing']:>5}"
        print(f"{name:<20} {r['passed']!s:<7} {detect:>8} {recover:>9} {counts} {r['max_param_diff']:>10.2e}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["passed"] for r in results.values()) else 1
