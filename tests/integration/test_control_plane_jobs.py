"""Jobs: submit, progress, logs, cancel, failure codes; an elastic job following the cluster's size."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from elastrain.backends.procs import pid_alive
from elastrain.client import ClientError
from elastrain.report import build_report
from elastrain.testing.clusters import all_running, job_world, settled
from elastrain.testing.jobs import REPO
from elastrain.testing.server import ControlPlane, sqlite_only
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(180)
SAMPLES = 10000  # MNIST-1D training set


def test_jobs_submit_progress_logs_cancel(cp: ControlPlane) -> None:
    with cp.client() as c:
        c.create_cluster("jobs", containers=2)
        c.wait_cluster("jobs", all_running)
        script = (
            "from elastrain.client import report_progress as r; print('start', flush=True); "
            "assert r(step=5, epoch=1, loss=0.5, samples_per_s=100.0, world_size=2); print('reported')"
        )
        ok = c.submit_job("jobs", ["python", "-c", script])
        job = wait_until(
            lambda: (j := c.get_job(ok["id"]))["status"] != "Running" and j, 60, "the job to end"
        )
        assert job["status"] == "Succeeded" and job["exit_code"] == 0, c.job_logs(ok["id"])[0]
        assert (job["step"], job["epoch"], job["loss"], job["samples_per_s"], job["world_size"]) == (
            5,
            1,
            0.5,
            100.0,
            2,
        )
        assert "start\nreported\n" in "".join(c.follow_job_logs(ok["id"]))

        failing = c.submit_job(
            "jobs", ["sh", "-c", "echo 'epoch 2 done: world 3, step 7, loss 0.25'; exit 7"]
        )
        job = wait_until(
            lambda: (j := c.get_job(failing["id"]))["status"] != "Running" and j, 60, "the job to end"
        )
        assert (job["status"], job["exit_code"], job["step"], job["world_size"]) == ("Failed", 7, 7, 3)
        out = cp.cli("job", "logs", "-f", str(failing["id"]))
        assert out.returncode == 7 and "epoch 2 done" in out.stdout

        sleeper = c.submit_job("jobs", ["sleep", "60"])
        assert c.cancel_job(sleeper["id"])["status"] == "Cancelled"
        wait_until(lambda: not pid_alive(sleeper["pid"]), 60, "the cancelled job to stop")

        orphan = c.submit_job("jobs", ["sleep", "60"])
        with cp.client(c.create_user("jobless")) as other, pytest.raises(ClientError) as err:
            other.get_job(orphan["id"])
        assert err.value.status == 404
        assert [j["id"] for j in c.list_jobs("jobs")] == [
            ok["id"],
            failing["id"],
            sleeper["id"],
            orphan["id"],
        ]
        c.delete_cluster("jobs")
        c.wait_deleted("jobs")
        assert not pid_alive(orphan["pid"]), "deleting the cluster must stop its jobs"


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_elastic_training_grows_and_shrinks_with_the_cluster(cp: ControlPlane) -> None:
    """The seed's flow: a job in the launcher container follows scale 2->4->2 live (the launcher trains)."""
    sqlite_only(cp)
    examples = cp.mounts / "examples"  # a copy: a symlink out of the allowed root would be refused
    examples.mkdir(exist_ok=True)
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(REPO / "examples" / name, examples / name)
    with cp.client() as c:
        c.create_cluster("train", containers=2, gpus_per_container=1, mounts=[f"{examples}:/examples"])
        c.wait_cluster("train", settled(c, "train"))
        run = "elastrain run -v --min-np 1 --max-np 4 --hostfile /etc/mpi/hostfile --join-grace 1"
        train = "python /examples/mnist_elastic.py --epochs 100 --batch-size 256 --step-sleep 0.02"
        job = c.submit_job("train", f"{run} {train}".split())

        world = job_world(c, job["id"])
        wait_until(world(2), 120, "the job to train with 2 workers")
        c.scale_cluster("train", 4)
        wait_until(world(4), 120, "the job to grow to 4 workers")
        c.scale_cluster("train", 2)
        wait_until(world(2), 120, "the job to shrink back to 2 workers")
        removed = wait_until(
            lambda: [e for e in c.events("train") if e["action"] == "container.removed"] or None,
            30,
            "the scaled-down containers to be removed",
        )
        assert {e["detail"]["reason"] for e in removed} == {"its workers left"}, removed
        step = c.get_job(job["id"])["step"] or 0
        wait_until(
            lambda: (c.get_job(job["id"])["step"] or 0) > step, 60, "training to go on after the shrink"
        )
        log = c.job_logs(job["id"])[0]
        grown = log.find("formed: 4 workers")
        assert grown != -1 and "formed: 2 workers (scale_in)" in log[grown:], log[-3000:]
        c.delete_cluster("train")  # stops the job with the cluster
        c.wait_deleted("train")
        assert not pid_alive(job["pid"])


def test_exec_stops_the_command_when_the_client_goes_away(cp: ControlPlane) -> None:
    import subprocess
    import sys

    sqlite_only(cp)
    marker = f"elastrain-exec-marker-{cp.port}"
    with cp.client() as c:
        c.create_cluster("execgone", containers=2)
        c.wait_cluster("execgone", all_running)
        env = {**os.environ, "ELASTRAIN_URL": cp.url, "ELASTRAIN_TOKEN": cp.token}
        cli = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "elastrain",
                "cluster",
                "exec",
                "execgone",
                "--",
                "sh",
                "-c",
                f"echo started; sleep 300; echo {marker}",
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        try:
            assert cli.stdout is not None and cli.stdout.readline() == "started\n"
            assert wait_until(lambda: _pids_with(marker), 30, "the command to run")
        finally:
            cli.kill()
            cli.wait()
        wait_until(lambda: not _pids_with(marker), 30, "the command to stop after the client went away")
        c.delete_cluster("execgone")
        c.wait_deleted("execgone")


def _pids_with(marker: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return [p for p in found if pid_alive(p)]


def test_seed_flow_run_typed_in_the_launcher_becomes_a_reporting_job(cp: ControlPlane) -> None:
    """Issue flow: 2 containers, `elastrain run -np 2 --hostfile /etc/mpi/hostfile` in the launcher:
    10,000 samples split 5,000 per worker; the run registers itself as a job that reports progress."""
    sqlite_only(cp)
    examples, ledger = cp.mounts / "seed-examples", cp.mounts / "seed-ledger"
    examples.mkdir(exist_ok=True)
    ledger.mkdir(exist_ok=True)
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(REPO / "examples" / name, examples / name)
    with cp.client() as c:
        c.create_cluster(
            "seed", containers=2, gpus_per_container=1, mounts=[f"{examples}:/ex", f"{ledger}:/ld"]
        )
        c.wait_cluster("seed", settled(c, "seed"))
        run = (
            "elastrain run -np 2 --hostfile /etc/mpi/hostfile --ledger /ld/run --checkpoint-dir /ld/ckpt "
            "--checkpoint-every 15 python /ex/mnist_elastic.py"
        )
        out = cp.cli("cluster", "exec", "seed", "--", *run.split(), "--epochs", "1", "--batch-size", "250")
        assert out.returncode == 0, out.stderr[-3000:]
        assert "epoch 0 done: world 2" in out.stdout + out.stderr
        (job,) = c.list_jobs("seed")
        assert job["command"][:2] == ["elastrain", "run"] and job["world_size"] == 2
        job = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 30, "the job to end"
        )
        assert (job["status"], job["exit_code"]) == ("Succeeded", 0)
        assert "epoch 0 done: world 2" in c.job_logs(job["id"])[0]  # the run's output is the job's log
        assert "job.attached" in [e["action"] for e in c.events("seed")]
        saved = c.job_checkpoints(
            job["id"]
        )  # steps 15, 30 and the final one at 40, as the container sees them
        assert [k["step"] for k in saved][:3] == [40, 30, 15], saved
        assert all(k["path"].startswith("/ld/ckpt/ckpt-") and k["bytes"] > 0 for k in saved), saved
        c.delete_cluster("seed")
    report = build_report(ledger / "run", SAMPLES)
    assert [(e["samples"], e["duplicates"], e["missing"]) for e in report["epochs"]] == [(SAMPLES, 0, 0)]
    (generation,) = report["generations"]
    assert sorted(generation["samples_per_worker"].values()) == [SAMPLES // 2] * 2
