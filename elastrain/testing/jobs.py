"""The job driver and watcher: start real `elastrain run` jobs from code, read their ledger and
events as they grow, wait for generations, clean up every PID they used.

Used by the demo, the chaos runner, the benchmarks' checks and the tests.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from elastrain.hostfile import Host, write_hostfile
from elastrain.report import build_report, load_ledgers
from elastrain.testing.processes import stop_tree
from elastrain.testing.waits import wait_until


def read_jsonl(path: Path, **match: Any) -> list[dict[str, Any]]:
    """The JSON lines of `path` whose fields equal `match` (a missing file reads as empty; a line
    still being written is skipped)."""
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if all(record.get(k) == v for k, v in match.items()):
            out.append(record)
    return out


class Pollable(Protocol):
    """A running job: `poll()` is None until it has ended (a Popen, or a control-plane job)."""

    def poll(self) -> int | None: ...


class JobWatcher:
    """Reads a running job's ledger and events as they grow."""

    def __init__(self, ledger_dir: Path, proc: Pollable | None) -> None:
        self.dir = ledger_dir
        self.proc = proc  # None: a job this process did not start (e.g. one submitted to a server)

    def generations(self) -> list[dict[str, Any]]:
        """The coordinator's generation records so far, oldest first."""
        return read_jsonl(self.dir / "events.jsonl", event="generation")

    def committed(self) -> int:
        """Steps committed so far (the newest committed step + 1), over every generation."""
        steps = [r["s"] for records in load_ledgers(self.dir).values() for r in records if r["k"] == "c"]
        return max(steps) + 1 if steps else 0

    def commits_in(self, generation: int) -> int:
        """Distinct steps committed in `generation`."""
        steps: set[int] = set()
        for records in load_ledgers(self.dir).values():
            steps.update(r["s"] for r in records if r["k"] == "c" and r["g"] == generation)
        return len(steps)

    def wait(self, what: str, predicate: Callable[[], bool], timeout: float = 180.0) -> None:
        """Wait for `predicate`; `WaitTimeout` after `timeout` or as soon as the job has ended."""
        proc = self.proc

        def ended() -> str | None:
            if proc is not None and proc.poll() is not None:
                return f"the job ended before {what}; see its output above"
            return None

        wait_until(predicate, timeout, what, interval=0.1, abort=ended)

    def wait_world(self, world: int, steps: int, timeout: float = 180.0) -> dict[str, Any]:
        """Wait for a generation of `world` workers that has committed `steps` steps; return it."""
        found: dict[str, Any] = {}

        def ready() -> bool:
            gens = self.generations()
            if gens and gens[-1]["world_size"] == world and self.commits_in(gens[-1]["generation"]) >= steps:
                found.update(gens[-1])
                return True
            return False

        self.wait(f"{steps} steps at world size {world}", ready, timeout)
        return found


REPO = Path(__file__).resolve().parents[2]  # a checkout: the example lives beside the package
EXAMPLE = REPO / "examples" / "mnist_elastic.py"
TRAIN_SAMPLES = 10_000


def hosts(n: int, first: int = 2) -> list[Host]:
    """`n` single-slot loopback hosts 127.0.0.<first>..."""
    return [Host(f"127.0.0.{i}", 1) for i in range(first, first + n)]


class LedgerRecords:
    """What a job left in its ledger directory: coordinator events, the report, the PIDs it used."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = ledger

    def events(self) -> list[dict[str, Any]]:
        """All coordinator events."""
        path = self.ledger / "events.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def report(self) -> dict[str, Any]:
        """The ledger-derived report."""
        return build_report(self.ledger, TRAIN_SAMPLES)

    def known_pids(self) -> set[int]:
        """Every agent and worker PID the job recorded."""
        pids = set()
        for event in self.events():
            if event.get("event") == "agent":
                pids.add(int(event["pid"]))
            for member in event.get("members", []):
                pids.add(int(member["pid"]))
        return {p for p in pids if p > 0}


class ElasticJob(LedgerRecords):
    """One `elastrain run` of the example (or any command) in `workdir`."""

    def __init__(
        self,
        workdir: Path,
        initial_hosts: list[Host],
        run_args: list[str],
        command: list[str],
        fresh_log: bool = True,
        env: dict[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        super().__init__(workdir / "ledger")
        self.hostfile = workdir / "hostfile"
        self.generation = 1
        write_hostfile(self.hostfile, initial_hosts, self.generation)
        argv = [
            sys.executable,
            "-m",
            "elastrain",
            "run",
            "--hostfile",
            str(self.hostfile),
            "--ledger",
            str(self.ledger),
            *run_args,
            *command,
        ]
        self.log = open(workdir / "job.log", "wb" if fresh_log else "ab")  # noqa: SIM115
        self.proc = subprocess.Popen(
            argv,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        self.watcher = JobWatcher(self.ledger, self.proc)

    def set_hosts(self, new_hosts: list[Host]) -> None:
        """Rewrite the watched hostfile (atomically, next generation)."""
        self.generation += 1
        write_hostfile(self.hostfile, new_hosts, self.generation)

    def wait_world(self, world: int, steps: int) -> dict[str, Any]:
        """Wait for a generation of `world` workers with `steps` committed steps."""
        return self.watcher.wait_world(world, steps)

    def wait(self, timeout: float = 300) -> int:
        """Wait for the job to end; return its exit code."""
        return self.proc.wait(timeout=timeout)

    def output(self) -> str:
        """Everything the job printed so far."""
        self.log.flush()
        return (self.workdir / "job.log").read_text(errors="replace")

    def known_pids(self) -> set[int]:
        """The launcher's PID and every agent and worker PID the job recorded."""
        return {self.proc.pid, *super().known_pids()}

    def cleanup(self) -> None:
        """Stop the job (SIGTERM to its process group) and kill every process it used, by PID."""
        stop_tree(self.proc, self.known_pids(), grace=15)
        self.log.close()


def assert_exactly_once(report: dict[str, Any], epochs: int) -> None:
    """Every epoch consumed every training sample exactly once."""
    assert [e["epoch"] for e in report["epochs"]] == list(range(epochs)), report["epochs"]
    for e in report["epochs"]:
        assert (e["samples"], e["duplicates"], e["missing"]) == (TRAIN_SAMPLES, 0, 0), e
