"""`elastrain chaos --platform`: platform faults (podman kill, network cut, server kill -9 during a
scale, reboot, disk full) on a container-backend cluster running an elastic job, and what each cost."""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from pathlib import Path
from typing import Any

from elastrain.errors import ConfigError


def _list() -> int:
    from elastrain.chaos.platform import PLATFORM_SCENARIOS

    for scenario in PLATFORM_SCENARIOS.values():
        print(f"{scenario.name:<26} {scenario.promise}")
    return 0


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def print_table(results: dict[str, dict[str, Any]]) -> None:
    """One line per fault: detection, recovery, steps lost; then the job's duplicated, missing, orphaned."""
    print(
        f"{'scenario':<26} {'passed':<7} {'detect_s':>8} {'recover_s':>9} {'lost':>5} "
        f"{'dup':>4} {'miss':>5} {'orphans':>7}"
    )
    for name, r in results.items():
        totals = f"{r.get('duplicated', '-')!s:>4} {r.get('missing', '-')!s:>5} {r.get('orphaned', '-')!s:>7}"
        for f in r.get("faults") or [{}]:
            times = f"{_fmt(f.get('detect_s')):>8} {_fmt(f.get('recover_s')):>9}"
            print(f"{name:<26} {r['passed']!s:<7} {times} {f.get('steps_lost', '-')!s:>5} {totals}")


def cmd_chaos_platform(args: argparse.Namespace) -> int:
    """List, run one or more scenarios, or soak; exit 0 only when every run passed."""
    from elastrain.chaos.platform import parse_platform_scenarios, soak_line, soak_schedule

    if not args.platform:
        raise ConfigError(
            "SCENARIO, --list and --soak go with --platform (elastrain chaos --platform --list)"
        )
    if args.list:
        return _list()
    if args.soak is None and not args.name:
        raise ConfigError("name a scenario (elastrain chaos --platform --list shows them), all, or --soak N")
    if args.soak is not None and args.soak < 1:
        raise ConfigError(f"--soak must be >= 1, got {args.soak}")
    scenarios = parse_platform_scenarios(args.name) if args.name else []
    from elastrain.chaos.platform_plane import PlatformUnavailable
    from elastrain.chaos.platform_runner import run_faults

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="elastrain-pchaos-"))
    print(f"chaos: platform runs in {workdir} (server logs, sample ledgers, checkpoints)")
    results: dict[str, dict[str, Any]] = {}
    try:
        for scenario in scenarios:
            results[scenario.name] = run_faults(scenario.faults, workdir / scenario.name)
        if args.soak is not None:
            seed = args.seed if args.seed is not None else random.randrange(1 << 31)
            print(f"chaos: platform soak, {args.soak} faults, seed {seed} (--soak {args.soak} --seed {seed})")
            faults = soak_schedule(seed, args.soak)
            results["soak"] = run_faults(faults, workdir / "soak", epochs=max(10, 2 * args.soak))
    except PlatformUnavailable as exc:
        raise ConfigError(str(exc)) from exc
    print_table(results)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    if "soak" in results:
        soak = results["soak"]
        print(soak_line(len(soak.get("faults", [])), soak["duplicated"], soak["missing"], soak["orphaned"]))
    return 0 if all(r["passed"] for r in results.values()) else 1
