"""Issue 29 item 3: a tenant's running jobs and a job's report rate are bounded.

The attacks: one user had 25 jobs running at once (each a process and a log), and a job may post
progress reports as fast as it can (each a database row). Now a user has at most
``--max-running-jobs`` Running (one more: 429), and a job at most ``--report-rate`` reports a
second in bursts of 5 seconds' worth (beyond: 429; its report token is still checked first).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest

from elastrain.testing.clusters import all_running
from elastrain.testing.waits import wait_until
from tests.security.harness import new_user, refused, start_server

pytestmark = pytest.mark.timeout(120)
MAX_JOBS = 2
RATE = 0.2  # one report each 5 s, bursts of 1: what passes does not depend on this machine's speed
FLOOD = 30


@pytest.mark.attack("29.running-jobs", "29.report-rate")
def test_running_jobs_and_report_rate_are_capped_per_tenant(tmp_path: Path) -> None:
    args = ("--insecure-host-commands", "--max-running-jobs", str(MAX_JOBS), "--report-rate", f"{RATE:g}")
    with start_server(tmp_path, args) as server:
        token = new_user(server, "jobber")
        with server.client(token) as jobber:
            jobber.create_cluster("jobs", containers=2)
            jobber.wait_cluster("jobs", all_running)
        command = ["sh", "-c", "echo report-token=$ELASTRAIN_REPORT_TOKEN; sleep 60"]
        with server.http(token=token) as api:
            answers = [
                api.post("/clusters/jobs/jobs", json={"command": command}) for _ in range(MAX_JOBS + 2)
            ]
            assert [a.status_code for a in answers] == [201] * MAX_JOBS + [429, 429], [
                a.text for a in answers
            ]
            refused(answers[-1], 429, "jobs running", "--max-running-jobs")
            job = answers[0].json()["id"]

            def report_token() -> str | None:
                found = re.search(r"^report-token=(\S+)", api.get(f"/jobs/{job}/logs").text, re.M)
                return found.group(1) if found else None

            secret = wait_until(report_token, 30, "the job to print its report token")
            progress = f"{server.url}/api/v1/jobs/{job}/progress"
            assert httpx.post(progress, json={"step": 1}, headers={"X-Job-Token": "wrong"}).status_code == 401
            started = time.monotonic()
            codes = [
                httpx.post(progress, json={"step": i}, headers={"X-Job-Token": secret}).status_code
                for i in range(FLOOD)
            ]
            allowed = 1 + int((time.monotonic() - started) * RATE) + 1  # the burst, what refilled
            assert codes[0] == 204 and 1 <= codes.count(204) <= allowed, codes
            assert codes.count(429) == FLOOD - codes.count(204), codes
            flood = httpx.post(progress, json={"step": 99}, headers={"X-Job-Token": secret})
            refused(flood, 429, "times a second")
            rows = api.get(f"/jobs/{job}/metrics").json()
            assert len(rows) <= codes.count(204) + 1  # a refused report wrote nothing
            for answer in answers[:MAX_JOBS]:  # a cancelled job frees its place
                assert api.delete(f"/jobs/{answer.json()['id']}").status_code == 200
            again = wait_until(
                lambda: api.post("/clusters/jobs/jobs", json={"command": ["true"]}).status_code == 201,
                30,
                "a place for a new job",
            )
            assert again
            api.delete("/clusters/jobs")
