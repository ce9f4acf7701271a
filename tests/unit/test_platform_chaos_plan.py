"""The pure parts of platform chaos: scenarios as data, the soak's seeded schedule, its summary line,
and what counts as a full disk."""

from __future__ import annotations

import errno
import itertools
import sqlite3

import pytest

from elastrain.chaos.platform import (
    PLATFORM_SCENARIOS,
    SOAK_KINDS,
    PlatformFaultKind,
    parse_platform_scenarios,
    soak_line,
    soak_schedule,
)
from elastrain.errors import ConfigError
from elastrain.server.disk_full import is_disk_full


def test_every_fault_kind_has_a_scenario_of_its_name() -> None:
    assert [s.name for s in PLATFORM_SCENARIOS.values()] == [k.value for k in PlatformFaultKind]
    for scenario in PLATFORM_SCENARIOS.values():
        assert [f.kind.value for f in scenario.faults] == [scenario.name]


def test_scenarios_parse_and_unknown_names_are_refused_with_the_valid_ones() -> None:
    assert [s.name for s in parse_platform_scenarios("kill-worker, reboot")] == ["kill-worker", "reboot"]
    assert len(parse_platform_scenarios("all")) == len(PLATFORM_SCENARIOS)
    with pytest.raises(ConfigError, match="unknown platform scenario 'nope'; choose from kill-worker"):
        parse_platform_scenarios("nope")
    with pytest.raises(ConfigError):
        parse_platform_scenarios(" , ")


def test_the_soak_schedule_is_seeded_covers_every_kind_and_never_repeats_a_kind_at_once() -> None:
    schedule = soak_schedule(7, 30)
    assert schedule == soak_schedule(7, 30)
    assert schedule != soak_schedule(8, 30)
    assert len(schedule) == 30
    assert {f.kind for f in schedule[: len(SOAK_KINDS)]} == set(SOAK_KINDS)
    assert all(a.kind != b.kind for a, b in itertools.pairwise(schedule))
    assert all(8 <= f.after_steps <= 20 for f in schedule)
    assert [f.kind for f in soak_schedule(7, 4)] == [f.kind for f in schedule[:4]]
    with pytest.raises(ConfigError, match="at least 1 fault"):
        soak_schedule(1, 0)


def test_the_soak_line_is_the_interface_the_checks_read() -> None:
    assert soak_line(30, 0, 0, 0) == "soak-platform: 30 faults, 0 duplicated, 0 missing, 0 orphaned"


def test_a_full_disk_is_recognised_through_the_exceptions_it_was_raised_from() -> None:
    assert is_disk_full(OSError(errno.ENOSPC, "No space left on device"))
    assert is_disk_full(sqlite3.OperationalError("database or disk is full"))
    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("commit failed") from inner
    except RuntimeError as outer:
        assert is_disk_full(outer)
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(ValueError("database is locked"))
