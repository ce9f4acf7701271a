"""Incidents of a control-plane job: sent by the launcher's reporter, stored as job events, in API and CLI.

(The kill-server chaos scenario covers the whole path with `elastrain run` and a server restart.)
"""

from __future__ import annotations

import json

import pytest

from elastrain.testing.clusters import all_running
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(120)

_REPORT = """
from elastrain.runtime.progress import IncidentReporter, _job_endpoint, _post
import os
r = IncidentReporter()
for g, cause in ((0, "start"), (1, "worker_failure")):
    r.report({"generation": g, "cause": cause, "world_size": 2 - g, "start_step": 40 * g,
              "steps_lost": 0, "detect_s": 0.25 * g, "recover_s": 0.1, "fault_at": 1.0})
assert r.flush(20)
url, token = _job_endpoint(os.environ, "incidents")
print("bad", _post(url, token, {"generation": 2, "cause": "meteor", "world_size": 1,
                                "start_step": 0, "steps_lost": 0, "detect_s": 0}))
print("forged", _post(url, "not-the-token", {"generation": 2, "cause": "start", "world_size": 1,
                                            "start_step": 0, "steps_lost": 0, "detect_s": 0}))
"""


def test_incidents_become_job_events_in_api_and_cli(cp: ControlPlane) -> None:
    with cp.client() as c:
        c.create_cluster("incidents", containers=2)
        c.wait_cluster("incidents", all_running)
        job = c.submit_job("incidents", ["python", "-c", _REPORT])
        done = wait_until(lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 60, "the job")
        log = c.job_logs(job["id"])[0]
        assert done["exit_code"] == 0, log
        assert "bad 422" in log and "forged 401" in log  # bad input refused, nothing stored
        events = c.job_events(job["id"])
        assert [e["action"] for e in events] == ["job.submitted", "job.incident", "job.incident"]
        incidents = [e["detail"] for e in events if e["action"] == "job.incident"]
        assert [(i["generation"], i["cause"], i["detect_s"]) for i in incidents] == [
            (0, "start", 0.0),
            (1, "worker_failure", 0.25),
        ]
        out = cp.cli("job", "events", str(job["id"]))
        assert out.returncode == 0, out.stderr
        job_id = job["id"]
        assert (
            f"Job #{job_id} lost a worker and goes on with 1 worker (generation 1): noticed in 0.25 s, "
            "training again after 0.1 s, no step lost." in out.stdout
        )
        as_json = json.loads(cp.cli("job", "events", str(job["id"]), "-o", "json").stdout)
        assert as_json == events
        missing = cp.cli("job", "events", "999999")
        assert missing.returncode != 0 and "not found" in missing.stderr and "Traceback" not in missing.stderr
        c.delete_cluster("incidents")
        c.wait_deleted("incidents")
