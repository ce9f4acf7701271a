"""The kill-server scenario: `elastrain server` is kill -9'd while a job it started trains.

The job runs in a 3-container cluster of a private server (its own data dir and port). While the
server is down a worker is killed too, so the generation change it causes has to reach the server
after the restart. Checked: the job kept training without the server, the restarted server adopted
the containers and shows the job's progress again and the incident among the job's events, and the
job finished with the usual exactly-once and parameter checks.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastrain.testing.faults import kill_member
from elastrain.testing.jobs import JobWatcher, LedgerRecords
from elastrain.testing.processes import kill_all
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

if TYPE_CHECKING:
    from elastrain.chaos.runner import ChaosRunner
    from elastrain.chaos.scenarios import Scenario


def _server(root: Path) -> ControlPlane:
    """A private server on the process backend, the chaos way: 8 GPUs, no mounts, no drain bound."""
    return ControlPlane(root, mounts=False, drain_seconds=None)


def run_kill_server(
    runner: ChaosRunner, scenario: Scenario, work: Path, reference: dict[str, Any]
) -> dict[str, Any]:
    """Run the kill-server scenario in `work`; returns the runner's figures plus the server's."""
    server = _server(work / "server")
    records = LedgerRecords(work / "ledger")
    try:
        server.start()
        return _scenario(runner, scenario, server, records, work, reference)
    finally:
        server.stop()
        kill_all(records.known_pids(), timeout=10)


def _scenario(
    runner: ChaosRunner,
    scenario: Scenario,
    server: ControlPlane,
    records: LedgerRecords,
    work: Path,
    reference: dict[str, Any],
) -> dict[str, Any]:
    from elastrain.chaos.runner import example_command

    slow = work / "slow"
    slow.touch()
    params = work / "params.pt"
    command = [
        sys.executable,
        "-m",
        "elastrain",
        "run",
        *scenario.run_args,
        "--hostfile",
        "/etc/mpi/hostfile",
    ]
    command += ["--ledger", str(records.ledger), *example_command(params, slow_while=slow)]
    with server.client() as c:
        c.create_cluster("chaos", containers=scenario.hosts)
        c.wait_cluster(
            "chaos", lambda k: k.state == "Running" and all(x.state == "Running" for x in k.containers)
        )
        job = c.submit_job("chaos", command)
        runner.say(f"{scenario.name}: job {job['id']} submitted: {' '.join(command[3:])}")
        watcher = JobWatcher(records.ledger, None)
        wait_until(lambda: watcher.committed() >= 40, 120, "40 committed steps", interval=0.1)
        wait_until(lambda: (c.get_job(job["id"])["step"] or 0) > 0, 30, "a progress report", interval=0.1)
    server.kill()
    killed_at = time.time()
    runner.say(f"kill -9 the server (pid {server.proc.pid if server.proc else '?'}); the job goes on")
    members = watcher.generations()[-1]["members"]
    if len(members) > 1:  # a generation change the server must learn about once it is back
        runner.say(f"kill -9 worker {members[-1]['worker_id']} while the server is down")
        kill_member(members[-1])
    steps = watcher.committed()
    wait_until(
        lambda: watcher.committed() >= steps + 20, 120, "20 more steps without the server", interval=0.1
    )
    restart_s = server.start()
    restarted_at, at_restart = time.monotonic(), watcher.committed()
    runner.say(f"server restarted ({restart_s:.2f}s to answer)")
    with server.client() as c:
        wait_until(
            lambda: (c.get_job(job["id"])["step"] or 0) > at_restart,
            60,
            "progress after the restart",
            interval=0.1,
        )
        resumed_s = time.monotonic() - restarted_at
        slow.unlink()
        done = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j,
            600,
            "the job to end",
            interval=0.1,
        )
        incidents = [e["detail"] for e in c.job_events(job["id"]) if e["action"] == "job.incident"]
        containers = {k.name: k.pid for k in c.get_cluster("chaos").containers}
    code = -1 if done["exit_code"] is None else int(done["exit_code"])
    result = runner.judge(scenario, records, code, killed_at, reference, params)
    expected = 1 + (len(members) > 1)  # the start, and the worker lost while the server was down
    result.update(
        server_restart_s=round(restart_s, 3),
        progress_resumed_s=round(resumed_s, 3),
        incidents_in_api=[(i["generation"], i["cause"]) for i in incidents],
        containers_adopted=len(containers) == scenario.hosts and all(containers.values()),
    )
    result["passed"] = bool(result["passed"] and len(incidents) >= expected and result["containers_adopted"])
    runner.say(f"{scenario.name}: server figures {result['incidents_in_api']} resumed {resumed_s:.2f}s")
    return result
