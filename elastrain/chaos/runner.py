"""Run chaos scenarios against the example job and check what they promise.

After each scenario: the job finished, every epoch consumed every sample exactly once, and the final
parameters equal a fault-free run's (float64, plain SGD, the `fixed` batch policy) within 1e-5.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from elastrain.chaos.netns import NetHosts, NetnsUnavailable
from elastrain.chaos.scenarios import Scenario
from elastrain.hostfile import Host
from elastrain.testing.faults import (
    Fault,
    FaultKind,
    agent_pid,
    current_members,
    kill_member,
    stop_until_dropped,
    truncate_checkpoint,
    wait_dropped,
)
from elastrain.testing.jobs import EXAMPLE, ElasticJob, LedgerRecords, hosts
from elastrain.testing.ports import free_port_pair
from elastrain.testing.processes import kill_pids, wait_gone

EPOCHS = 3
TRAINING = ("--dtype", "float64", "--optimizer", "sgd", "--lr", "0.05")
TOLERANCE = 1e-5


def example_command(
    params_out: Path, sleep: float = 0.03, slow_while: Path | None = None, epochs: int = EPOCHS
) -> list[str]:
    """The example job every scenario runs (slowed by `sleep` per step while `slow_while` exists)."""
    slow = ["--slow-while", str(slow_while)] if slow_while is not None else []
    return [
        "python",
        str(EXAMPLE),
        "--epochs",
        str(epochs),
        "--step-sleep",
        str(sleep),
        *slow,
        *TRAINING,
        "--params-out",
        str(params_out),
    ]


def _committed_steps(job: ElasticJob) -> int:
    gens = job.watcher.generations()
    return job.watcher.commits_in(gens[-1]["generation"]) if gens else 0


def _adopted(job: ElasticJob) -> bool:
    return any(e.get("event") == "adopted" for e in job.events())


class ChaosSkipped(Exception):
    """A scenario that this machine cannot run (e.g. not root); the message says why."""


class ChaosRunner:
    """Runs scenarios in `workdir`; the fault-free reference run is made once and reused."""

    def __init__(self, workdir: Path, log: Any = sys.stderr) -> None:
        self.workdir = workdir
        self.log = log
        self._reference: dict[int, dict[str, Any]] = {}
        self._net: NetHosts | None = None
        self.epochs = EPOCHS  # the soak trains longer (its reference run too)

    def say(self, text: str) -> None:
        print(f"chaos: {text}", file=self.log, flush=True)

    def reference(self, world: int = 2) -> dict[str, Any]:
        """Final parameters of a fault-free run at a constant `world` workers (made once, then reused)."""
        if world not in self._reference:
            import torch

            work = self.workdir / ("reference" if world == 2 else f"reference-{world}")
            work.mkdir(parents=True, exist_ok=True)
            self.say(f"fault-free reference run ({world} workers)")
            command = example_command(work / "params.pt", sleep=0.0, epochs=self.epochs)
            job = ElasticJob(work, hosts(world), ["-np", str(world)], command)
            try:
                if job.wait(timeout=900) != 0:
                    raise RuntimeError(f"the reference run failed:\n{job.output()[-2000:]}")
            finally:
                job.cleanup()
            self._reference[world] = torch.load(work / "params.pt")
        return self._reference[world]

    @staticmethod
    def param_diff(reference: dict[str, Any], final: dict[str, Any]) -> float:
        """Largest per-tensor relative difference."""
        return max(
            ((ref - final[name]).norm() / ref.norm().clamp_min(1e-12)).item()
            for name, ref in reference.items()
        )

    def run(self, scenario: Scenario) -> dict[str, Any]:
        """Run one scenario; returns its figures and `passed`. Every process, mount and link is removed."""
        reference = self.reference()
        work = self.workdir / scenario.name
        work.mkdir(parents=True, exist_ok=True)
        if scenario.control_plane:
            from elastrain.chaos.control_plane import run_kill_server

            return run_kill_server(self, scenario, work, reference)
        jobs: list[ElasticJob] = []
        try:
            return self._run(scenario, work, reference, jobs)
        finally:
            for j in jobs:
                j.cleanup()
            self._teardown_network()
            if scenario.small_disk:
                subprocess.run(["umount", str(work / "ckpt")], capture_output=True, check=False)

    def _run(
        self, scenario: Scenario, work: Path, reference: dict[str, Any], jobs: list[ElasticJob]
    ) -> dict[str, Any]:
        params = work / "params.pt"
        args = list(scenario.run_args)
        job_hosts = hosts(scenario.hosts)
        if scenario.netns:
            self._net = self._network(scenario.hosts)
            job_hosts = [Host(self._net.address(i), 1) for i in range(scenario.hosts)]
            args += ["--coordinator-host", self._net.gateway, "--agent-wrapper", self._net.agent_wrapper]
        if scenario.small_disk:
            self._mount_small_disk(work / "ckpt")
        if scenario.checkpoints:
            args += ["--checkpoint-dir", str(work / "ckpt"), "--checkpoint-every", "20"]
        port = free_port_pair()
        args += ["--coordinator-port", str(port)]
        env = {"ELASTRAIN_JOB_TOKEN": f"chaos-{scenario.name}-{port}"}
        slow = work / "slow"
        slow.touch()  # slow steps while the faults are injected, full speed after
        command = example_command(params, slow_while=slow)
        self.say(f"{scenario.name}: starting")
        job = ElasticJob(work, job_hosts, args, command, env=env)
        jobs.append(job)
        fault_at = 0.0
        for fault in scenario.faults:
            at = self._inject(job, fault, work)
            fault_at = fault_at or at
        if scenario.restart:
            job.wait(timeout=60)
            if not scenario.restart_args:  # nobody adopts the workers: wait for them to give up
                wait_gone(job.known_pids() - {job.proc.pid}, timeout=120, interval=0.2)
            again = [*args, *scenario.restart_args]
            self.say(
                f"{scenario.name}: starting again ({' '.join(scenario.restart_args) or '--resume auto'})"
            )
            job = ElasticJob(work, job_hosts, again, command, fresh_log=False, env=env)
            jobs.append(job)
            if scenario.restart_args:  # full speed only once adopted: else the job may end before that
                new = job
                new.watcher.wait("the running job to be adopted", lambda: _adopted(new))
        slow.unlink(missing_ok=True)
        code = job.wait(timeout=600)
        return self.judge(scenario, job, code, fault_at, reference, params)

    @staticmethod
    def _network(count: int) -> NetHosts:
        try:
            return NetHosts(count).setup()
        except NetnsUnavailable as exc:
            raise ChaosSkipped(str(exc)) from exc

    def _teardown_network(self) -> None:
        if self._net is not None:
            self._net.teardown()
            self._net = None

    @staticmethod
    def _mount_small_disk(path: Path) -> None:
        path.mkdir(parents=True, exist_ok=True)
        done = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(path)], capture_output=True
        )
        if done.returncode != 0:
            raise ChaosSkipped(
                f"cannot mount a small tmpfs for the checkpoints (needs root): {done.stderr!r}"
            )

    def _inject(self, job: ElasticJob, fault: Fault, work: Path) -> float:
        if fault.kind == FaultKind.FILL_DISK:
            job.watcher.wait(f"{fault.at_step} steps", lambda: _committed_steps(job) >= fault.at_step)
            filler = work / "ckpt" / "filler"
            with open(filler, "wb") as f, contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * 65536)
                    f.flush()
            self.say(f"filled {work / 'ckpt'} ({filler.stat().st_size} bytes of filler)")
            return time.time()
        if fault.kind == FaultKind.CORRUPT_CHECKPOINT:
            from elastrain.runtime.checkpoint import list_checkpoints

            state = truncate_checkpoint(list_checkpoints(work / "ckpt")[0])
            self.say(f"truncated {state}")
            return time.time()
        job.watcher.wait(f"{fault.at_step} steps", lambda: _committed_steps(job) >= fault.at_step)
        victim = current_members(job.watcher)[fault.target]
        now = time.time()
        if fault.kind == FaultKind.KILL_WORKER:
            self.say(f"kill -9 worker {victim['worker_id']} (pid {victim['pid']})")
            kill_member(victim)
        elif fault.kind == FaultKind.STOP_WORKER:
            self.say(f"SIGSTOP worker {victim['worker_id']} (pid {victim['pid']})")
            stop_until_dropped(job.watcher, victim)
        elif fault.kind == FaultKind.PARTITION_HOST:
            assert self._net is not None, "partition-host needs a scenario with netns=True"
            index = self._net.index(victim["host"])
            self.say(f"partition host {victim['host']} (bridge port {self._net.port(index)} down)")
            self._net.partition(index)
            try:
                wait_dropped(job.watcher, victim)
            finally:
                self._net.heal(index)
            self.say(f"host {victim['host']} reconnected")
        elif fault.kind == FaultKind.KILL_AGENT:
            agent = agent_pid(job, victim["host"])
            self.say(f"kill -9 the agent of {victim['host']} (pid {agent})")
            kill_pids([agent])
        elif fault.kind == FaultKind.KILL_COORDINATOR:
            self.say(f"kill -9 the launcher/coordinator (pid {job.proc.pid})")
            kill_pids([job.proc.pid])
        elif fault.kind == FaultKind.KILL_ALL:
            self.say("kill -9 the launcher, every agent and every worker")
            kill_pids(job.known_pids())
        return now

    def judge(
        self,
        scenario: Scenario,
        job: LedgerRecords,
        code: int,
        fault_at: float,
        reference: dict[str, Any],
        params: Path,
        tolerance: float = TOLERANCE,
    ) -> dict[str, Any]:
        """The scenario's figures and whether its promises held (finished, exactly once, parameters)."""
        import torch

        report = job.report()
        epochs = report["epochs"]
        duplicates = sum(e["duplicates"] for e in epochs)
        missing = sum(e["missing"] for e in epochs) + 10_000 * max(0, self.epochs - len(epochs))
        diff = self.param_diff(reference, torch.load(params)) if params.exists() else float("inf")
        incidents = [e for e in job.events() if e.get("event") == "incident" and e["cause"] != "start"]
        after = [
            g
            for g in report["generations"]
            if g["cause"] != "start" or g["run"] != report["generations"][0]["run"]
        ]
        detect = incidents[0]["detect_s"] if incidents else None
        first_run = report["generations"][0]["run"] if report["generations"] else ""
        resumed = scenario.restart and not scenario.restart_args  # a new run had to take over
        first_step = self._first_commit_after(job, fault_at, exclude_run=first_run if resumed else None)
        result = {
            "passed": code == 0 and duplicates == 0 and missing == 0 and diff < tolerance,
            "exit_code": code,
            "detect_s": detect,
            "recover_s": round(first_step - fault_at, 3) if first_step else None,
            "steps_lost": max((g["steps_lost"] for g in after), default=0),
            "samples_replayed": sum(g["samples_replayed"] for g in after),
            "duplicates": duplicates,
            "missing": missing,
            "max_param_diff": diff,
            "generations": [(g["world_size"], g["cause"]) for g in report["generations"]],
        }
        self.say(f"{scenario.name}: {'PASSED' if result['passed'] else 'FAILED'} {result}")
        return result

    @staticmethod
    def _first_commit_after(job: LedgerRecords, when: float, exclude_run: str | None = None) -> float | None:
        from elastrain.report import load_ledgers

        times = [
            r["t"]
            for records in load_ledgers(job.ledger).values()
            for r in records
            if r["k"] == "c" and r["t"] > when and r.get("run") != exclude_run
        ]
        return min(times) if times else None
