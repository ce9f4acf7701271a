"""`elastrain demo`: the main job. 2 workers -> 4 (hostfile rewritten) -> kill -9 one -> back to 2.

The demo drives a real `elastrain run` of examples/mnist_elastic.py, acts when the ledger shows the
job has reached each stage, then prints the report built from the workers' own ledgers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from elastrain.errors import ConfigError
from elastrain.hostfile import Host, write_hostfile
from elastrain.report import build_report, format_report
from elastrain.testing.faults import kill_member
from elastrain.testing.jobs import EXAMPLE, TRAIN_SAMPLES, JobWatcher
from elastrain.testing.processes import terminate
from elastrain.testing.tempdirs import run_workdir

HOSTS = [f"127.0.0.{i}" for i in range(2, 6)]


def _say(text: str) -> None:
    print(f"\n=== demo: {text}", flush=True)


def run_demo(json_path: Path | None, epochs: int = 8, workdir: Path | None = None) -> int:
    """Run the demo; returns the exit code (0 when every check of the report holds)."""
    if not EXAMPLE.exists():
        raise ConfigError(f"{EXAMPLE} not found; run the demo from a checkout of the repository")
    with run_workdir(workdir, "elastrain-demo-") as work:
        return _run_in(work, json_path, epochs, keep=workdir is not None)


def _run_in(work: Path, json_path: Path | None, epochs: int, keep: bool) -> int:
    """The demo with its hostfile, ledger and result in `work` (`keep`: the caller's, reported)."""
    hostfile, ledger, result = work / "hostfile", work / "ledger", work / "result.json"
    write_hostfile(hostfile, [Host(h, 1) for h in HOSTS[:2]], generation=1)
    _say("preparing MNIST-1D (generated offline, cached)")
    subprocess.run([sys.executable, str(EXAMPLE.parent / "mnist1d_data.py")], check=True)
    command = [
        sys.executable,
        "-m",
        "elastrain",
        "run",
        "--min-np",
        "2",
        "--max-np",
        "4",
        "--hostfile",
        str(hostfile),
        "--ledger",
        str(ledger),
        "--join-grace",
        "20",
        sys.executable,
        str(EXAMPLE),
        "--epochs",
        str(epochs),
        "--step-sleep",
        "0.004",
        "--result",
        str(result),
    ]
    _say(f"starting: elastrain run --min-np 2 --max-np 4 --hostfile {hostfile} python {EXAMPLE.name}")
    proc = subprocess.Popen(command, start_new_session=True)
    watcher = JobWatcher(ledger, proc)
    try:
        watcher.wait_world(2, 60)
        _say("rewriting the hostfile: 2 -> 4 hosts")
        write_hostfile(hostfile, [Host(h, 1) for h in HOSTS], generation=2)
        gen4 = watcher.wait_world(4, 60)
        victim = next(m for m in gen4["members"] if m["host"] == HOSTS[3])
        _say(f"kill -9 worker {victim['worker_id']} (pid {victim['pid']})")
        kill_member(victim)
        watcher.wait_world(3, 60)
        _say("rewriting the hostfile: 4 -> 2 hosts (graceful scale-in)")
        write_hostfile(hostfile, [Host(h, 1) for h in HOSTS[:2]], generation=3)
        watcher.wait_world(2, 1)
        code = proc.wait(timeout=600)
    except BaseException:
        terminate(proc, timeout=30, group=True)
        raise
    report = build_report(ledger, TRAIN_SAMPLES)
    if result.exists():
        report.update(json.loads(result.read_text()))
    report["job_exit_code"] = code
    report["workdir"] = str(work) if keep else "(a temporary directory, removed; keep one with --workdir)"
    ok = (
        code == 0
        and report["surviving_worker_pids_unchanged"]
        and all(
            e["samples"] == TRAIN_SAMPLES and e["duplicates"] == 0 and e["missing"] == 0
            for e in report["epochs"]
        )
        and len(report["epochs"]) == epochs
    )
    report["passed"] = ok
    _say("report")
    print(format_report(report))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
        print(f"report written to {json_path}")
    return 0 if ok else 1
