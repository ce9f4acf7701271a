"""Chaos plans as data: the soak schedule is reproducible by its seed; bad input is one line."""

from __future__ import annotations

import subprocess
import sys

from elastrain.chaos.scenarios import FaultKind
from elastrain.chaos.soak import MENU, STEPS_PER_EPOCH, epochs_for, schedule


def test_the_same_seed_gives_the_same_schedule() -> None:
    plan = schedule(50, 7)
    assert plan == schedule(50, 7) and plan != schedule(50, 8)
    assert len(plan) == 50 and {f.kind for f in plan} <= set(MENU)
    assert {FaultKind.KILL_WORKER, FaultKind.KILL_AGENT} <= {f.kind for f in plan}
    assert all(8 <= f.gap <= 20 for f in plan)


def test_the_soak_trains_long_enough_for_its_schedule() -> None:
    plan = schedule(50, 7)
    assert epochs_for(plan) * STEPS_PER_EPOCH > sum(f.gap for f in plan) * 2
    assert epochs_for(schedule(1, 0)) == 3


def test_bad_soak_and_scenario_flags_are_one_line_errors() -> None:
    for flags in (["--scenario", "soak", "--faults", "0"], ["--scenario", "kill-worker,explode"]):
        done = subprocess.run(
            [sys.executable, "-m", "elastrain", "chaos", *flags], capture_output=True, text=True, timeout=60
        )
        assert done.returncode != 0 and "Traceback" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
