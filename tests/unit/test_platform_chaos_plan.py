"""The pure parts of platform chaos: scenarios as data, the soak's seeded schedule, its summary line,
and what counts as a full disk."""

from __future__ import annotations

import errno
import itertools
import json
import sqlite3
from pathlib import Path

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


def test_a_write_that_finds_the_disk_full_is_answered_507_problem_details() -> None:
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from elastrain.server.problems import install

    app = FastAPI()
    install(app)

    @app.post("/full")
    def full() -> None:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as exc:
            raise RuntimeError("the commit failed") from exc

    @app.post("/broken")
    def broken() -> None:
        raise RuntimeError("a bug")

    with TestClient(app, raise_server_exceptions=False) as client:
        answer = client.post("/full")
        assert answer.status_code == 507
        assert answer.headers["content-type"] == "application/problem+json"
        body = answer.json()
        assert body["type"] == "https://elastrain.dev/problems/storage-full"
        assert "data directory is full" in body["detail"] and "retry" in body["detail"]
        assert client.post("/broken").status_code == 500


def test_the_commit_log_reads_only_what_was_appended_and_waits_for_torn_lines(tmp_path: Path) -> None:
    from elastrain.chaos.platform_faults import CommitLog

    def commit(run: str, g: int, s: int, t: float) -> str:
        return json.dumps({"k": "c", "g": g, "s": s, "ws": 2, "t": t, "run": run}, separators=(",", ":"))

    generation = {"event": "generation", "run": "r1", "generation": 1, "world_size": 3, "requested_at": 10.0}
    (tmp_path / "events.jsonl").write_text(json.dumps(generation) + "\n")
    a, b = tmp_path / "a#0.jsonl", tmp_path / "b#0.jsonl"
    a.write_text(commit("r1", 0, 0, 1.0) + "\n" + commit("r1", 0, 1, 2.0) + "\n")
    b.write_text(commit("r1", 0, 0, 1.1) + "\n" + '{"k":"p","g":0,"s":1,"i":[1,2]}\n')
    log = CommitLog(tmp_path)
    assert log.count() == 2  # step 0 committed by both workers counts once
    assert log.first_full_commit(5.0, 3) is None
    with open(a, "a") as f:
        f.write(commit("r1", 1, 2, 12.0) + "\n" + commit("r1", 1, 3, 13.0)[:20])  # a torn last line
    assert log.count() == 3 and log.first_full_commit(5.0, 3) == 12.0
    assert log.first_full_commit(5.0, 2) is None and log.first_full_commit(11.0, 3) is None
    with open(a, "a") as f:
        f.write(commit("r1", 1, 3, 13.0)[20:] + "\n")
    assert log.count() == 4


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (["--platform", "--list"], 0, "server-kill-during-scale   the restarted server finishes the scale"),
        (["--platform", "nope"], 2, "unknown platform scenario 'nope'; choose from kill-worker"),
        (["--platform"], 2, "name a scenario (elastrain chaos --platform --list shows them)"),
        (["--platform", "--soak", "0"], 2, "--soak must be >= 1, got 0"),
        (["kill-worker"], 2, "SCENARIO, --list and --soak go with --platform"),
    ],
)
def test_the_platform_cli_lists_and_refuses_bad_input_in_one_line(
    args: list[str], code: int, says: str
) -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "elastrain", "chaos", *args], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == code, done.stderr
    assert says in done.stdout + done.stderr
    assert "Traceback" not in done.stderr
