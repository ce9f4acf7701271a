"""One running training job per system, with the actions the benchmark takes on it.

`ElastrainJob`: ``elastrain run --min-np 2 --max-np 3 --hostfile H --ledger L``; hosts are loopback
addresses 127.0.0.2, .3, ... added to / removed from the watched hostfile.
`TorchrunJob`: one ``torch.distributed.run`` agent per node (``--nnodes 1:3 --nproc-per-node 1``,
c10d rendezvous), TUNED (``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1``, ``last_call_timeout=1``) or with
torchrun's DEFAULT rendezvous settings. Both expose the same verbs: start at a world size, add a
node, kill -9 the newest node's worker, gracefully remove the newest node, stop.
"""

from __future__ import annotations

import abc
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proclib import Job
from steplog import LogReader

from elastrain.testing.jobs import read_jsonl
from elastrain.testing.ports import free_port
from elastrain.testing.processes import kill_pids

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent


@dataclass
class Timeouts:
    """How long the driver waits for each thing before calling the run hung (seconds)."""

    start_s: float = 120.0
    event_s: float = 60.0
    stop_s: float = 30.0


class TrainingJob(abc.ABC):
    """A job of one system: its processes, its step log, its stop file."""

    system = ""

    def __init__(self, run_id: str, name: str, workdir: Path) -> None:
        self.job = Job(run_id, name, workdir)
        self.workdir = workdir
        self.log_dir = workdir / "steps"
        self.stop_file = workdir / "stop"
        self.reader = LogReader(self.log_dir)
        self.nodes: list[str] = []

    def script_args(self) -> list[str]:
        """Flags every training process gets."""
        return ["--log-dir", str(self.log_dir), "--stop-file", str(self.stop_file)]

    @abc.abstractmethod
    def start(self, world: int) -> None:
        """Start the job with `world` nodes of one worker each."""

    @abc.abstractmethod
    def alive(self) -> bool:
        """True while the job (its launcher / any agent) is running."""

    @abc.abstractmethod
    def scale_out(self) -> float:
        """Add one node; returns the time of the request."""

    @abc.abstractmethod
    def scale_in(self) -> float:
        """Gracefully remove the newest node; returns the time of the request."""

    def kill_worker(self) -> tuple[float, int | None]:
        """kill -9 the newest node's worker; returns (time, pid) (pid None if it was not found)."""
        self.reader.poll()
        pid = self.reader.latest_pid_on(self.nodes[-1])
        if pid is None:
            return time.time(), None
        t = time.time()
        kill_pids([pid], signal.SIGKILL)
        return t, pid

    def request_stop(self) -> int:
        """Ask every rank to stop a little ahead of the current step; returns that step."""
        self.reader.poll()
        margin = max(10, int(1.5 / max(self.reader.step_time(), 1e-3)))
        stop_at = self.reader.max_step() + margin
        tmp = self.stop_file.with_suffix(".tmp")
        tmp.write_text(str(stop_at))
        os.replace(tmp, self.stop_file)
        return stop_at

    def stop(self, timeout_s: float) -> dict[str, Any]:
        """Stop the job cleanly if it will, kill what is left; reports how it went."""
        clean = False
        stop_at = None
        if self.alive():
            stop_at = self.request_stop()
            clean = self.job.wait_exit(timeout_s)
        killed = self.job.kill(grace_s=0.0 if clean else 2.0)
        return {"stop_at": stop_at, "exited_cleanly": clean, "killed_after_stop": killed}

    def kill(self) -> int:
        """Kill everything of this job now; returns how many processes had to be killed."""
        return self.job.kill(grace_s=0.5)

    def extra_figures(self) -> dict[str, Any]:
        """System-specific records the driver passes to the breakdown (elastrain: ledger, events)."""
        return {}


class ElastrainJob(TrainingJob):
    """`elastrain run` over a watched hostfile of loopback hosts."""

    system = "elastrain"

    def __init__(self, run_id: str, name: str, workdir: Path) -> None:
        super().__init__(run_id, name, workdir)
        self.hostfile = workdir / "hostfile"
        self.ledger = workdir / "ledger"
        self._next = 2

    def _new_host(self) -> str:
        host = f"127.0.0.{self._next}"
        self._next += 1
        return host

    def _write_hosts(self) -> float:
        tmp = self.hostfile.with_suffix(".tmp")
        tmp.write_text("".join(f"{h} slots=1\n" for h in self.nodes))
        t = time.time()
        os.replace(tmp, self.hostfile)
        return t

    def start(self, world: int) -> None:
        self.nodes = [self._new_host() for _ in range(world)]
        self._write_hosts()
        argv = [
            sys.executable,
            "-m",
            "elastrain",
            "run",
            "--min-np",
            "2",
            "--max-np",
            "3",
            "--hostfile",
            str(self.hostfile),
            "--ledger",
            str(self.ledger),
            sys.executable,
            str(BENCH / "train_elastrain.py"),
            *self.script_args(),
        ]
        self.job.start("launcher", argv, cwd=REPO)

    def alive(self) -> bool:
        return self.job.alive("launcher")

    def scale_out(self) -> float:
        self.nodes.append(self._new_host())
        return self._write_hosts()

    def scale_in(self) -> float:
        self.nodes.pop()
        return self._write_hosts()

    def extra_figures(self) -> dict[str, Any]:
        return {
            "generations": read_jsonl(self.ledger / "events.jsonl", event="generation"),
            "joins": [r for p in sorted(self.ledger.glob("*#*.jsonl")) for r in read_jsonl(p, k="g")],
        }


class TorchrunJob(TrainingJob):
    """One torchrun agent per node, c10d rendezvous on 127.0.0.1, TUNED or DEFAULT settings."""

    def __init__(self, run_id: str, name: str, workdir: Path, tuned: bool, max_restarts: int = 3) -> None:
        super().__init__(run_id, name, workdir)
        self.tuned = tuned
        self.system = "torchrun_tuned" if tuned else "torchrun_default"
        self.port = free_port()
        self.max_restarts = max_restarts
        self._next = 1

    def _agent_argv(self) -> list[str]:
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1:3",
            "--nproc-per-node",
            "1",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{self.port}",
            "--rdzv-id",
            "bench",
            "--max-restarts",
            str(self.max_restarts),
        ]
        if self.tuned:
            argv += ["--rdzv-conf", "last_call_timeout=1"]
        return [
            *argv,
            str(BENCH / "train_torchrun.py"),
            "--checkpoint",
            str(self.workdir / "checkpoint.pt"),
            *self.script_args(),
        ]

    def _start_agent(self) -> float:
        node = f"n{self._next}"
        self._next += 1
        self.nodes.append(node)
        env = {"BENCH_NODE": node}
        if self.tuned:
            env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        t = time.time()
        self.job.start(f"agent-{node}", self._agent_argv(), env=env, cwd=REPO)
        return t

    def start(self, world: int) -> None:
        for i in range(world):
            self._start_agent()
            if i == 0:
                time.sleep(0.5)  # the first agent hosts the rendezvous store

    def alive(self) -> bool:
        return any(self.job.alive(f"agent-{n}") for n in self.nodes)

    def scale_out(self) -> float:
        return self._start_agent()

    def scale_in(self) -> float:
        node = self.nodes.pop()
        t = time.time()
        self.job.signal(f"agent-{node}", signal.SIGTERM)
        return t


class StandaloneTorchrun(TrainingJob):
    """``torchrun --standalone --nproc-per-node N`` (the steady-state baseline)."""

    system = "torchrun"

    def start(self, world: int) -> None:
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            str(world),
            str(BENCH / "train_torchrun.py"),
            "--checkpoint",
            str(self.workdir / "checkpoint.pt"),
            *self.script_args(),
        ]
        self.job.start("launcher", argv, cwd=REPO)

    def alive(self) -> bool:
        return self.job.alive("launcher")

    def scale_out(self) -> float:
        raise NotImplementedError("a standalone job does not resize")

    def scale_in(self) -> float:
        raise NotImplementedError("a standalone job does not resize")


class StaticElastrain(TrainingJob):
    """``elastrain run -np N -H 127.0.0.1:N`` (the steady-state contender; no ledger, as by default)."""

    system = "elastrain"

    def start(self, world: int) -> None:
        argv = [
            sys.executable,
            "-m",
            "elastrain",
            "run",
            "-np",
            str(world),
            "-H",
            f"127.0.0.1:{world}",
            sys.executable,
            str(BENCH / "train_elastrain.py"),
            *self.script_args(),
        ]
        self.job.start("launcher", argv, cwd=REPO)

    def alive(self) -> bool:
        return self.job.alive("launcher")

    def scale_out(self) -> float:
        raise NotImplementedError("a static job does not resize")

    def scale_in(self) -> float:
        raise NotImplementedError("a static job does not resize")
