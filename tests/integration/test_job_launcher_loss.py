"""A job survives its launcher: `podman kill` of the launcher container under a submitted elastic job.

The replacement launcher starts the job again with ``elastrain run --rejoin`` on the same coordinator
port and token; the workers in the other containers are adopted in memory and the job goes on, every
sample once. A command that fails is the user's: started again only within ``retries``.
"""

from __future__ import annotations

import pytest

from elastrain.backends.podmanctl import podman
from elastrain.report import build_report
from elastrain.testing.clusters import all_running, job_world
from elastrain.testing.containers import ContainerPlane, shared_storage
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(600)
SAMPLES = 10000
EPOCHS = 10


def test_a_killed_launcher_does_not_end_the_job(ccp: ContainerPlane) -> None:
    data = shared_storage(ccp, "survive-data")
    with ccp.client() as c:
        c.create_cluster("survive", framework="pytorch", containers=3, mounts=[f"{data}:/data"])
        c.wait_cluster("survive", all_running, timeout=120)
        elastic = "elastrain run -v --min-np 2 --max-np 3 --hostfile /etc/mpi/hostfile --ledger /data/el"
        train = f"python /data/mnist_elastic.py --epochs {EPOCHS} --batch-size 200 --step-sleep 0.03"
        job = c.submit_job("survive", f"{elastic} {train}".split())
        assert (job["platform_restarts"], job["max_platform_restarts"]) == (0, 3)
        world = job_world(c, job["id"])
        wait_until(world(3), 180, "the job to train with 3 workers")
        podman("kill", f"elastrain-{ccp.key}-survive-launcher")

        def restarted() -> list[dict[str, object]] | None:
            found = [e["detail"] for e in c.job_events(job["id"]) if e["action"] == "job.restarted"]
            return found or None

        [event] = wait_until(restarted, 90, "the job to be started again in the new launcher")
        assert event["cause"] == "platform" and "launcher container died" in str(event["reason"])
        assert "--rejoin" in event["command"]  # type: ignore[operator]
        running = c.get_job(job["id"])
        assert running["status"] == "Running" and running["platform_restarts"] == 1
        done = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 420, "the job to finish"
        )
        log = c.job_logs(job["id"])[0]
        assert (done["status"], done["exit_code"]) == ("Succeeded", 0), log[-4000:]
        assert (done["platform_restarts"], done["user_restarts"]) == (1, 0)
        report = build_report(data / "el", SAMPLES)
        assert [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]] == [
            (SAMPLES, 0, 0)
        ] * EPOCHS, report["epochs"]
        causes = [(g["world_size"], g["cause"]) for g in report["generations"]]
        # adopted in memory (the survivors' state, numbering and step go on), then grown back
        assert causes == [(3, "start"), (2, "coordinator_restart"), (3, "scale_out")], causes
        assert report["generations"][1]["start_step"] > 0
        c.delete_cluster("survive")
        c.wait_deleted("survive", timeout=60)


def test_a_failing_command_is_retried_only_within_retries(ccp: ContainerPlane) -> None:
    with ccp.client() as c:
        c.create_cluster("retry", framework="pytorch", containers=2)
        c.wait_cluster("retry", all_running, timeout=120)
        job = c.submit_job("retry", ["sh", "-c", "echo attempt; exit 7"], retries=2)
        done = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 120, "the job to end"
        )
        assert (done["status"], done["exit_code"], done["user_restarts"], done["platform_restarts"]) == (
            "Failed",
            7,
            2,
            0,
        )
        assert c.job_logs(job["id"])[0].count("attempt\n") == 3
        causes = [e["detail"]["cause"] for e in c.job_events(job["id"]) if e["action"] == "job.restarted"]
        assert causes == ["user", "user"]
        c.delete_cluster("retry")
        c.wait_deleted("retry", timeout=60)
