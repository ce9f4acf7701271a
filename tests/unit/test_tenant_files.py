"""`elastrain.backends.tenant_files` and `elastrain.server.bounded` on real files and threads: what a
tenant can place where the server reads (a FIFO, a link, a sparse giant, a linked directory) is refused
or bounded, and a call that hangs is answered at its deadline without holding the caller."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from elastrain.backends.tenant_files import (
    TenantFileError,
    last_lines,
    read_range,
    read_whole,
    tail_lines,
)
from elastrain.server.bounded import BoundedCalls, Overloaded, TimedOut

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    (tmp_path / "c" / "launcher" / "var" / "log" / "jobs").mkdir(parents=True)
    return tmp_path / "c"


def _log(base: Path) -> Path:
    return base / "launcher" / "var" / "log" / "jobs" / "1.log"


def test_a_fifo_is_refused_at_once(base: Path) -> None:
    os.mkfifo(_log(base))  # no writer: a blocking open would wait for ever
    with pytest.raises(TenantFileError, match="not a regular file \\(a FIFO\\)"):
        read_range(_log(base), base)


def test_links_are_refused_anywhere_below_the_base(base: Path, tmp_path: Path) -> None:
    _log(base).symlink_to(_log(base).name)  # a loop
    with pytest.raises(TenantFileError, match="symbolic link"):
        read_range(_log(base), base)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "1.log").write_text("not the tenant's\n")
    jobs = _log(base).parent
    jobs.rename(jobs.with_name("kept"))
    jobs.symlink_to(elsewhere)
    with pytest.raises(TenantFileError, match="jobs is a symbolic link"):
        read_range(_log(base), base)
    with pytest.raises(TenantFileError, match="not under"):
        read_range(elsewhere / "1.log", base)


def test_a_sparse_giant_costs_one_window(base: Path) -> None:
    with open(_log(base), "wb") as f:
        f.write(b"head\n")
        f.truncate(50 * 10**9)
    piece = read_range(_log(base), base, None, 1 << 20)
    assert piece.size == 50 * 10**9 and piece.offset == 50 * 10**9 - (1 << 20) and len(piece.data) == 1 << 20
    assert read_range(_log(base), base, 0, 16).data == b"head\n" + b"\0" * 11
    with pytest.raises(TenantFileError, match="more than the 64 read"):
        read_whole(_log(base), base, max_bytes=64)


def test_a_tail_starts_at_a_whole_line(base: Path) -> None:
    _log(base).write_text("".join(f"line {i}\n" for i in range(1000)))
    lines = tail_lines(_log(base), base, limit=100)
    assert lines[-1] == "line 999\n" and all(line.startswith("line ") for line in lines)
    assert sum(map(len, lines)) <= 100
    assert tail_lines(base / "launcher" / "missing.log", base) == []
    assert last_lines(["a\n", "bb\n", "ccc\n"], 7) == ["bb\n", "ccc\n"]


def test_a_hanging_call_is_answered_at_its_deadline_and_holds_its_slot() -> None:
    release = threading.Event()
    calls = BoundedCalls("reads", 0.2, per_key=1, total=2)
    with pytest.raises(TimedOut, match=r"did not return within 0\.2 s"):
        calls.call("bob", lambda: release.wait(20))
    assert calls.busy("bob")
    with pytest.raises(Overloaded, match="still running"):
        calls.call("bob", lambda: True)
    assert calls.call("alice", lambda: "read") == "read"  # another cluster's calls go on
    returned = threading.Event()
    calls.on_done = lambda key: key == "bob" and returned.set()
    release.set()
    assert returned.wait(5) and not calls.busy("bob")  # its slot is free once it returned
    with pytest.raises(ValueError, match="raised"):
        calls.call("bob", lambda: int("raised"))
