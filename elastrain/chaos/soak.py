"""The soak: many random faults (seeded, so a schedule is reproducible) in one long run of the example.

After every fault the job has to recover (a generation without the victim commits steps again);
the "cluster" then replaces lost hosts with fresh ones, so the job grows back to 3 workers. At the
end the usual checks hold: finished, every epoch exactly once, parameters equal to a fault-free run.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastrain.chaos.runner import TOLERANCE
from elastrain.chaos.scenarios import Scenario
from elastrain.hostfile import Host
from elastrain.report import load_ledgers
from elastrain.testing.faults import (
    FaultKind,
    agent_pid,
    current_members,
    kill_member,
    stop_until_dropped,
    truncate_checkpoint,
)
from elastrain.testing.jobs import ElasticJob
from elastrain.testing.ports import free_port_pair
from elastrain.testing.processes import kill_pids, wait_gone

if TYPE_CHECKING:
    from elastrain.chaos.runner import ChaosRunner

# weights: frequent cheap faults, a few whole-job restarts
MENU: dict[FaultKind, int] = {
    FaultKind.KILL_WORKER: 5,
    FaultKind.STOP_WORKER: 2,
    FaultKind.KILL_AGENT: 3,
    FaultKind.KILL_COORDINATOR: 1,
    FaultKind.KILL_ALL: 1,
    FaultKind.CORRUPT_CHECKPOINT: 1,  # the newest checkpoint is truncated, then everything is killed
}
WORLD = 3
STEPS_PER_EPOCH = 157  # 10,000 samples in global batches of 64
RUN_ARGS = ("--min-np", "1", "--max-np", str(WORLD), "--heartbeat-timeout", "3", "--join-grace", "1")


@dataclass(frozen=True)
class SoakFault:
    """One fault of the schedule: `kind` after `gap` more committed steps, against member `target`."""

    kind: FaultKind
    gap: int
    target: int


def schedule(faults: int, seed: int) -> list[SoakFault]:
    """The seeded fault schedule (the same seed gives the same schedule)."""
    rng = random.Random(seed)
    kinds = list(MENU)
    picks = rng.choices(kinds, weights=[MENU[k] for k in kinds], k=faults)
    return [SoakFault(kind, rng.randint(8, 20), rng.randrange(WORLD)) for kind in picks]


def epochs_for(plan: list[SoakFault]) -> int:
    """Enough epochs that the job is still training when the last fault comes (steps replay after resumes)."""
    steps = sum(f.gap + 60 for f in plan)  # a recovery takes ~4 s: ~30-60 slowed steps
    return max(3, math.ceil(steps / STEPS_PER_EPOCH) + 1)


def final_batches(ledger: Path) -> dict[int, frozenset[int]]:
    """Step -> the global batch (sample indices of every rank) of its last committed execution."""
    fed: dict[tuple[str, int, int], set[int]] = {}
    committed: dict[tuple[str, int, int], float] = {}
    for records in load_ledgers(ledger).values():
        for r in records:
            key = (str(r.get("run", "")), int(r["g"]), int(r["s"]))
            if r["k"] == "p":
                fed.setdefault(key, set()).update(r["i"])
            elif r["k"] == "c":
                committed[key] = max(committed.get(key, 0.0), float(r["t"]))
    return {key[2]: frozenset(fed.get(key, ())) for key, _ in sorted(committed.items(), key=lambda kv: kv[1])}


def other_batches(ledger: Path, reference_ledger: Path) -> int:
    """How many steps trained on a global batch other than the reference run's same step."""
    ours, ref = final_batches(ledger), final_batches(reference_ledger)
    return sum(1 for step, batch in ref.items() if ours.get(step) != batch) + len(set(ours) - set(ref))


class Soak:
    """Runs one schedule against one long job."""

    def __init__(self, runner: ChaosRunner, work: Path, plan: list[SoakFault]) -> None:
        self.runner = runner
        self.work = work
        self.plan = plan
        self.next_host = 2
        self.jobs: list[ElasticJob] = []
        self.hosts: list[Host] = [self._fresh() for _ in range(WORLD)]

    def _fresh(self) -> Host:
        host = Host(f"127.0.1.{self.next_host}", 1)  # a new "node": its slot has a full quota
        self.next_host += 1
        return host

    @property
    def job(self) -> ElasticJob:
        return self.jobs[-1]

    def start(self, command: list[str], extra: tuple[str, ...] = ()) -> None:
        """Start (or restart, or replace the launcher of) the job."""
        args = [*RUN_ARGS, "--max-restarts", "1000", *self.ckpt_args, *extra]
        fresh = not self.jobs
        self.jobs.append(ElasticJob(self.work, self.hosts, args, command, fresh_log=fresh, env=self.env))

    def run(self, command: list[str], port: int) -> tuple[int, list[dict[str, Any]]]:
        """Inject every fault of the plan; return the final exit code and what was done."""
        self.ckpt_args = ["--checkpoint-dir", str(self.work / "ckpt"), "--checkpoint-every", "10"]
        self.ckpt_args += ["--coordinator-port", str(port)]
        self.env = {"ELASTRAIN_JOB_TOKEN": f"chaos-soak-{port}"}
        self.command = command
        self.start(command)
        done = []
        for i, fault in enumerate(self.plan):
            if self.job.proc.poll() is not None:
                self.runner.say(f"soak: the job ended after {i} faults (too few epochs for the schedule)")
                break
            self._wait_steps(fault.gap, f"{fault.gap} steps before fault {i}")
            t0, before, steps = time.monotonic(), len(self._markers()), self.job.watcher.committed()
            what = self._inject(fault)
            self._recover(before, steps)
            done.append(
                {
                    "i": i,
                    "kind": fault.kind.value,
                    "what": what,
                    "recovered_s": round(time.monotonic() - t0, 2),
                }
            )
            self.runner.say(
                f"soak fault {i + 1}/{len(self.plan)}: {what}; recovered in {done[-1]['recovered_s']}s"
            )
        return self._finish(), done

    def _wait_steps(self, gap: int, what: str) -> None:
        watcher = self.job.watcher
        target = watcher.committed() + gap
        watcher.wait(what, lambda: watcher.committed() >= target)

    def _inject(self, fault: SoakFault) -> str:
        members = current_members(self.job.watcher)
        victim = members[fault.target % len(members)]
        if (
            fault.kind in (FaultKind.KILL_WORKER, FaultKind.STOP_WORKER, FaultKind.KILL_AGENT)
            and len(members) < 2
        ):
            fault = SoakFault(FaultKind.KILL_ALL, fault.gap, fault.target)  # no survivor would keep the state
        if fault.kind == FaultKind.KILL_WORKER:
            kill_member(victim)
            self._drop_host(victim["host"])
            return f"kill -9 worker {victim['worker_id']}"
        if fault.kind == FaultKind.STOP_WORKER:
            stop_until_dropped(self.job.watcher, victim)
            return f"SIGSTOP worker {victim['worker_id']} until dropped"
        if fault.kind == FaultKind.KILL_AGENT:
            kill_pids([agent_pid(self.job, victim["host"])])
            self._drop_host(victim["host"])
            return f"kill -9 the agent of {victim['host']}"
        if fault.kind == FaultKind.KILL_COORDINATOR:
            kill_pids([self.job.proc.pid])
            self.job.proc.wait(timeout=30)
            self.start(self.command, ("--rejoin",))
            return "kill -9 the launcher; a --rejoin launcher adopts the job"
        launchers = {j.proc.pid for j in self.jobs}
        everything = {p for j in self.jobs for p in j.known_pids()}
        kill_pids(everything)
        for job in self.jobs:
            job.proc.wait(timeout=30)  # reap the launchers (a zombie would look alive)
        wait_gone(everything - launchers, timeout=60, interval=0.2)
        note = ""
        if fault.kind == FaultKind.CORRUPT_CHECKPOINT:
            from elastrain.runtime.checkpoint import list_checkpoints

            found = list_checkpoints(self.work / "ckpt")
            if found:
                truncate_checkpoint(found[0])
                note = f", truncated {found[0].name}"
        self.start(self.command)
        return f"kill -9 everything{note}; restarted with --resume auto"

    def _drop_host(self, host: str) -> None:
        """The cluster replaces the lost node: a fresh host instead of `host`."""
        self.hosts = [h for h in self.hosts if h.name != host] + [self._fresh()]

    def _markers(self) -> list[dict[str, Any]]:
        """Generation and adoption events so far (every run of the job writes to the same ledger)."""
        return [e for e in self.job.events() if e.get("event") in ("generation", "adopted")]

    def _recover(self, before: int, steps: int) -> None:
        """Wait for a new generation (or an adoption), steps past `steps`, and WORLD workers again."""
        self.job.set_hosts(self.hosts)
        watcher = self.job.watcher

        def recovered() -> bool:
            markers = self._markers()
            gens = watcher.generations()
            return bool(
                len(markers) > before
                and watcher.committed() > steps
                and (markers[-1]["event"] == "adopted" or gens[-1]["world_size"] == WORLD)
            )

        watcher.wait("the job to train again with 3 workers", recovered, timeout=240)

    def _finish(self) -> int:
        (self.work / "slow").unlink(missing_ok=True)
        return self.job.wait(timeout=1200)

    def cleanup(self) -> None:
        """Kill every process of every launcher this soak started."""
        for job in self.jobs:
            with contextlib.suppress(Exception):
                job.cleanup()


def run_soak(runner: ChaosRunner, faults: int, seed: int) -> dict[str, Any]:
    """The `soak` scenario: the seeded schedule, one long job, the usual checks, per-cause figures."""
    from elastrain.chaos.runner import example_command

    plan = schedule(faults, seed)
    runner.epochs = epochs_for(plan)
    runner.say(f"soak: seed {seed}, {faults} faults, {runner.epochs} epochs: {[f.kind.value for f in plan]}")
    reference = runner.reference()
    # Over thousands of float64 steps the summation order of the all-reduce (it depends on the world
    # size) is amplified by SGD: two fault-free runs at 2 and 3 workers differ by this much.
    floor = runner.param_diff(reference, runner.reference(WORLD))
    tolerance = max(TOLERANCE, 2 * floor)
    work = runner.workdir / "soak"
    work.mkdir(parents=True, exist_ok=True)
    (work / "slow").touch()
    params = work / "params.pt"
    soak = Soak(runner, work, plan)
    t0 = time.monotonic()
    try:
        command = example_command(params, sleep=0.1, slow_while=work / "slow", epochs=runner.epochs)
        code, done = soak.run(command, free_port_pair())
        scenario = Scenario("soak", WORLD, RUN_ARGS, (), restart=True)
        result = runner.judge(scenario, soak.job, code, time.time(), reference, params, tolerance)
        other = other_batches(soak.job.ledger, runner.workdir / "reference" / "ledger")
    finally:
        soak.cleanup()
    incidents = [e for e in soak.job.events() if e.get("event") == "incident" and e["cause"] != "start"]
    by_cause: dict[str, list[dict[str, Any]]] = {}
    for incident in incidents:
        by_cause.setdefault(incident["cause"], []).append(incident)
    result.update(
        steps_with_other_batches=other,
        noise_floor=floor,
        tolerance=tolerance,
        passed=bool(result["passed"] and other == 0),
        seed=seed,
        faults=len(done),
        wall_s=round(time.monotonic() - t0, 1),
        injected=done,
        per_cause={
            cause: {
                "count": len(items),
                "detect_s_max": max(i["detect_s"] for i in items),
                "recover_s_max": max((i["recover_s"] or 0.0) for i in items),
                "steps_lost_max": max(i["steps_lost"] for i in items),
            }
            for cause, items in by_cause.items()
        },
    )
    return result
