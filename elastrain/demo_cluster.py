"""`elastrain demo --cluster`: the seed's flow through the control plane, start to finish.

Builds (or reuses) the container image, starts `elastrain server` (SQLite, 8 virtual GPUs, the
container backend: podman) in a temporary data dir, creates a 2-container PyTorch cluster, submits the
example job in the launcher container (``elastrain run --min-np 2 --max-np 4 --hostfile
/etc/mpi/hostfile``), scales the cluster 2 -> 4 while it trains, ``podman kill``s one worker container,
scales back to 2, waits for the job, checks every epoch consumed each sample exactly once (the
workers' own ledgers), deletes the cluster and stops the server. Prints what it timed. Where podman
cannot run containers it runs the same flow on the process backend and says so.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from elastrain.backends.podmanctl import podman, podman_works
from elastrain.client import Client
from elastrain.errors import ConfigError
from elastrain.report import build_report, format_report
from elastrain.testing.faults import kill_member
from elastrain.testing.jobs import EXAMPLE, TRAIN_SAMPLES, JobWatcher
from elastrain.testing.server import ControlPlane
from elastrain.testing.tempdirs import run_workdir
from elastrain.testing.waits import wait_until

EXAMPLES = EXAMPLE.parent


def _say(text: str) -> None:
    print(f"\n=== demo --cluster: {text}", flush=True)


class _ServerJob:
    """A control-plane job seen as a process: `poll()` is None while it runs."""

    def __init__(self, client: Client, job_id: int) -> None:
        self.client, self.job_id = client, job_id

    def poll(self) -> int | None:
        job = self.client.get_job(self.job_id)
        return None if job["status"] in ("Pending", "Running") else int(job["exit_code"] or 1)


def run_cluster_demo(json_path: Path | None, epochs: int = 6, workdir: Path | None = None) -> int:
    """Run the control-plane demo; returns 0 when every check holds."""
    if not (EXAMPLES / "mnist_elastic.py").exists():
        raise ConfigError(f"{EXAMPLES} not found; run the demo from a checkout of the repository")
    with run_workdir(workdir, "elastrain-cluster-demo-") as work:
        return _run_in(work, json_path, epochs, keep=workdir is not None)


def _run_in(work: Path, json_path: Path | None, epochs: int, keep: bool) -> int:
    """The demo with its mounts and server data in `work` (`keep`: the caller's, reported)."""
    mounts = work / "mounts"
    examples, ledger = mounts / "examples", mounts / "examples" / "ledger"
    examples.mkdir(parents=True, exist_ok=True)
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(EXAMPLES / name, examples / name)
    subprocess.run([sys.executable, str(examples / "mnist1d_data.py")], check=True, stdout=subprocess.DEVNULL)
    timings: dict[str, float] = {}
    containers = podman_works()
    if containers:
        from elastrain.images.build import build_image

        _say("elastrain image build (cached by its inputs)")
        t0 = time.monotonic()
        built = build_image("pytorch", progress=lambda line: print(f"  {line}", flush=True))
        timings["image build" + (" (cached)" if built.cached else "")] = time.monotonic() - t0
        examples.chmod(0o777)  # the tenant's uid in the containers writes the ledger there
    else:
        _say("podman cannot run containers here: the process backend (no isolation) runs the flow")
    backend = "container" if containers else "process"
    server = ControlPlane(
        work / "server",
        extra_args=("--allow-mount", str(mounts)),
        backend=backend,
        mounts=False,
        drain_seconds=None,
    )
    try:
        _say(f"starting elastrain server at {server.url}")
        server.start()
        _say(f"server at {server.url}; data in {server.data}")
        with server.client() as c:
            code = _flow(c, examples, ledger, epochs, timings, server.data if containers else None)
    finally:
        server.stop()  # deletes what is left of the cluster, stops the server, kills stray inits
    report = build_report(ledger, TRAIN_SAMPLES)
    ok = code == 0 and all(
        (e["samples"], e["duplicates"], e["missing"]) == (TRAIN_SAMPLES, 0, 0) for e in report["epochs"]
    )
    ok = ok and len(report["epochs"]) == epochs
    report.update(job_exit_code=code, timings_s=timings, passed=ok)
    report["workdir"] = str(work) if keep else "(a temporary directory, removed; keep one with --workdir)"
    _say("report")
    print(format_report(report))
    print("timings: " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))
    if json_path is not None:
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
        print(f"report written to {json_path}")
    return 0 if ok else 1


def _flow(
    c: Client, examples: Path, ledger: Path, epochs: int, timings: dict[str, float], podman_data: Path | None
) -> int:
    """The seed's flow; `podman_data` is the server's data dir on the container backend (None: process)."""

    def running(n: int) -> Callable[[Any], bool]:
        return lambda k: k.state == "Running" and sum(x.state == "Running" for x in k.containers) == n

    t0 = time.monotonic()
    framework = "pytorch" if podman_data is not None else "horovod"
    _say(f"cluster create tthvd --framework {framework} --containers 2 --gpus-per-container 1")
    c.create_cluster(
        "tthvd", framework=framework, containers=2, gpus_per_container=1, mounts=[f"{examples}:/examples"]
    )
    c.wait_cluster("tthvd", running(2), timeout=60)
    timings["create -> 2 Running"] = time.monotonic() - t0
    print(c.hostfile("tthvd"), end="")
    run = "elastrain run -v --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile --join-grace 5"
    run += " --ledger /examples/ledger"
    train = f"python /examples/mnist_elastic.py --epochs {epochs} --step-sleep 0.02"
    _say(f"job submit tthvd -- {run} {train}")
    job = c.submit_job("tthvd", [*run.split(), *train.split()])
    watcher = JobWatcher(ledger, _ServerJob(c, int(job["id"])))
    watcher.wait_world(2, 20)
    _say("cluster scale tthvd --containers 4 (while the job trains)")
    t0 = time.monotonic()
    c.scale_cluster("tthvd", 4)
    wait_until(lambda: c.hostfile("tthvd").count("slots=") == 4, 60, "4 hosts in the hostfile", interval=0.1)
    timings["scale 2->4 -> hostfile updated"] = time.monotonic() - t0
    generation = watcher.wait_world(4, 20)
    timings["scale 2->4 -> job trains with 4"] = time.monotonic() - t0
    # a worker container's rank (the launcher container also runs the coordinator: losing it ends the job)
    victim = [m for m in generation["members"] if "-worker-" in m["host"]][-1] if podman_data else None
    victim = victim or generation["members"][-1]
    if podman_data is not None:
        from elastrain.backends.container import server_key

        name = f"elastrain-{server_key(podman_data)}-{victim['host']}"
        _say(f"podman kill {name} (worker {victim['worker_id']}: a node failure)")
        podman("kill", name)
    else:
        _say(f"kill -9 worker {victim['worker_id']} (pid {victim['pid']})")
        kill_member(victim)
    watcher.wait_world(3, 20)
    _say("cluster scale tthvd --containers 2 (graceful scale-in)")
    t0 = time.monotonic()
    c.scale_cluster("tthvd", 2)
    watcher.wait_world(2, 1)
    wait_until(lambda: len(c.get_cluster("tthvd").containers) == 2, 60, "2 containers", interval=0.1)
    timings["scale 4->2 -> containers removed after their workers left"] = time.monotonic() - t0
    done = wait_until(
        lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j,
        900,
        "the job to finish",
        interval=0.1,
    )
    _say(f"job {done['status']} (exit {done['exit_code']}); cluster delete tthvd")
    c.delete_cluster("tthvd")
    c.wait_deleted("tthvd", timeout=60)
    return int(done["exit_code"] if done["exit_code"] is not None else 1)
