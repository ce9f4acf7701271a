"""`elastrain run` for real: the command's own options, scripts that finish or keep failing, torchrun's flags.

Each test runs one short job (a few seconds) and checks afterwards that none of its agents is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.jobs import LedgerRecords

pytestmark = pytest.mark.timeout(120)

SHOW = textwrap.dedent(
    """
    import json, os, sys
    print("SHOW " + json.dumps({
        "rank": int(os.environ["RANK"]),
        "world": int(os.environ["WORLD_SIZE"]),
        "run_id": os.environ["TORCHELASTIC_RUN_ID"],
        "master": os.environ["MASTER_ADDR"],
        "argv": sys.argv[1:],
    }), flush=True)
    """
)

MIXED = textwrap.dedent(
    """
    import os, sys, time
    rank = int(os.environ["RANK"])
    print(f"started rank {rank}", flush=True)
    if rank == 0:
        sys.exit(0)  # finished first
    time.sleep(1.5)
    if sys.argv[1] == "fail":
        raise RuntimeError("late failure")
    print(f"finished rank {rank}", flush=True)
    """
)

FAILING = textwrap.dedent(
    """
    import os, time
    print(f"started {os.environ['ELASTRAIN_WORKER_ID']}", flush=True)
    time.sleep(0.2)
    1 / 0
    """
)


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str
    seconds: float

    def shows(self) -> list[dict[str, Any]]:
        """The SHOW records the ranks printed, by rank."""
        records = [
            json.loads(line.split("SHOW ", 1)[1]) for line in self.stdout.splitlines() if "SHOW " in line
        ]
        return sorted(records, key=lambda r: r["rank"])


def _our_agent(pid: int) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"elastrain.agent.agent" in cmdline


def run_job(cwd: Path, *args: str, timeout: float = 60.0) -> Done:
    """`elastrain run --ledger ... ARGS` in `cwd`; afterwards no agent of it may be left (killed by PID)."""
    ledger = cwd / "ledger"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTRAIN_")}
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "elastrain", "run", "--ledger", str(ledger), *args],
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
        agents = {
            int(e["pid"])
            for e in LedgerRecords(ledger).events()
            if e.get("event") == "agent" and e.get("pid")
        }
        deadline = time.monotonic() + 10
        while any(_our_agent(pid) for pid in agents) and time.monotonic() < deadline:
            time.sleep(0.05)
        left = [pid for pid in agents if _our_agent(pid)]
        for pid in left:  # their scripts die with them (parent-death signal)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not left, f"agents still running after the job: {left}"
    return Done(proc.returncode, stdout, stderr, time.monotonic() - started)


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "show.py").write_text(SHOW)
    (tmp_path / "mixed.py").write_text(MIXED)
    (tmp_path / "failing.py").write_text(FAILING)
    (tmp_path / "showmod").mkdir()
    (tmp_path / "showmod" / "__main__.py").write_text(SHOW)
    return tmp_path


def test_options_after_the_command_reach_the_script(work: Path) -> None:
    script_args = ["--n", "5", "-v", "-np", "3", "--hostfile", "x", "--", "--max-restarts", "-H"]
    done = run_job(work, "-np", "2", "-H", "127.0.0.2:2", "python", "show.py", *script_args)
    assert done.returncode == 0, done.stderr
    assert [(r["rank"], r["world"], r["argv"]) for r in done.shows()] == [
        (0, 2, script_args),
        (1, 2, script_args),
    ]


def test_equals_form_host_list_and_a_module_with_options(work: Path) -> None:
    done = run_job(
        work, "--num-proc=2", "-H", "127.0.0.2:1,127.0.0.3:1", "python", "-m", "showmod", "-v", "--np", "3"
    )
    assert done.returncode == 0, done.stderr
    assert [(r["world"], r["argv"]) for r in done.shows()] == [(2, ["-v", "--np", "3"])] * 2


def test_script_that_exits_0_runs_once(work: Path) -> None:
    done = run_job(work, "-np", "1", "-H", "127.0.0.2:1", "python", "-c", "print('hi')")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["[127.0.0.2#0] hi"]
    assert done.stderr.splitlines()[-1] == "elastrain: training finished"


def test_rank_that_finishes_first_is_not_restarted(work: Path) -> None:
    done = run_job(work, "-np", "2", "-H", "127.0.0.2:2", "python", "mixed.py", "ok")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count("started rank 0") == 1
    assert done.stdout.count("started rank 1") == 1
    assert done.stdout.count("finished rank 1") == 1


def test_rank_failing_after_another_finished_ends_a_fixed_size_job(work: Path) -> None:
    done = run_job(work, "-np", "2", "-H", "127.0.0.2:2", "python", "mixed.py", "fail")
    assert done.returncode == 1
    assert "RuntimeError: late failure" in done.stdout
    last = done.stderr.splitlines()[-1]
    assert "rank 0 had finished (exit 0) when a worker failure needed the other ranks restarted" in last
    assert done.seconds < 30  # not after --elastic-timeout (60 s)


def test_failing_script_stops_after_max_restarts_with_its_last_error(work: Path) -> None:
    done = run_job(work, "--max-restarts", "2", "-np", "2", "-H", "127.0.0.2:2", "python", "failing.py")
    assert done.returncode == 1
    last = done.stderr.splitlines()[-1]
    assert re.fullmatch(
        r"elastrain: job failed after 2 restarts: rank [01] on 127\.0\.0\.2 exited 1: "
        r"ZeroDivisionError: division by zero",
        last,
    ), done.stderr
    runs = [done.stdout.count(f"started 127.0.0.2#{slot}") for slot in (0, 1)]
    # the slot that gave up failed 3 times (a run stopped for another slot's restart does not count);
    # at most 1 + 2 + 2 generations were formed
    assert max(runs) >= 3, runs
    assert sum(runs) <= 10, runs
    assert "Traceback" not in done.stderr


def test_native_command_that_never_joins_is_stopped_with_a_hint(work: Path) -> None:
    done = run_job(work, "--mode", "native", "-np", "1", "-H", "127.0.0.2:1", "python", "-c", "print('hi')")
    assert done.returncode == 1
    runs = [line for line in done.stdout.splitlines() if line.endswith("] hi")]
    assert len(runs) == 1, runs  # a worker that exits 0 has finished: its slot is not refilled
    last = done.stderr.splitlines()[-1]
    assert "exited 0 without joining the job" in last
    assert "--mode restart" in last


def test_torchrun_standalone_runs_local_workers(work: Path) -> None:
    done = run_job(
        work,
        "--standalone",
        "--nproc-per-node",
        "2",
        "--rdzv-backend",
        "c10d",
        "--rdzv-id",
        "job-7",
        "show.py",
        "--lr",
        "1",
    )
    assert done.returncode == 0, done.stderr
    assert [(r["rank"], r["world"], r["run_id"], r["master"], r["argv"]) for r in done.shows()] == [
        (0, 2, "job-7", "127.0.0.1", ["--lr", "1"]),
        (1, 2, "job-7", "127.0.0.1", ["--lr", "1"]),
    ]


def test_torchrun_nnodes_range_and_rdzv_endpoint(work: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    done = run_job(
        work,
        "-v",
        "--nnodes",
        "1:2",
        "--nproc_per_node",
        "1",
        "--rdzv_endpoint",
        f"127.0.0.1:{port}",
        "-H",
        "127.0.0.2:1,127.0.0.3:1",
        "python",
        "show.py",
    )
    assert done.returncode == 0, done.stderr
    assert f"coordinator at 127.0.0.1:{port}; 1..2 workers, starting 2" in done.stderr
    assert [r["world"] for r in done.shows()] == [2, 2]
