"""The first job runs unchanged on a fresh cluster of every framework, in containers.

tests/browser/test_first_job.py proves the portal's prefilled command on the process backend and in
PyTorch containers; here the same command (`elastrain.examples.first_job_command`, what the portal's
job box holds and what `elastrain cluster create` prints as the next step) is submitted, exactly as
suggested, on a fresh 2-container cluster of each other framework: Horovod, DeepSpeed, Megatron and
Slurm. The cluster is created through the API as a new user's client would (``{"name", "containers": 2,
"framework"}``), the job submitted once both containers are Running, and it must end Succeeded with the
example's "first job done" line in its log. Timings are printed (``-s``).

One container server serves the module (the `ccp` fixture); each framework's image is built first when
its inputs changed (a no-op otherwise); every cluster is deleted after its test. Skips where podman
cannot run.
"""

from __future__ import annotations

import re
import shlex
import time
from collections.abc import Iterator

import httpx
import pytest

from elastrain.client import Client
from elastrain.examples import first_job_command
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import ContainerPlane, framework_image
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(600)
FRAMEWORKS = ["horovod", "deepspeed", "megatron", "slurm"]
# rank 0's last line, after the "[host#rank] " prefix `elastrain run` puts on every worker's output
DONE = re.compile(r"first job done: (\d+) steps, train accuracy [\d.]+$", re.MULTILINE)


@pytest.fixture(params=FRAMEWORKS)
def fresh(request: pytest.FixtureRequest, ccp: ContainerPlane) -> Iterator[tuple[Client, str]]:
    """A new 2-container cluster of the framework, created with the body a new user's client sends,
    both containers Running; yields (client, cluster name) and deletes the cluster after."""
    framework: str = request.param
    framework_image(framework)  # built once per run, when its inputs changed
    name = f"fj-{framework}"
    t0 = time.monotonic()
    with httpx.Client(base_url=ccp.url, headers={"Authorization": f"Bearer {ccp.token}"}, timeout=30) as api:
        made = api.post("/api/v1/clusters", json={"name": name, "containers": 2, "framework": framework})
    assert made.status_code in (200, 201), made.text
    with ccp.client() as c:
        try:
            cluster = c.wait_cluster(name, all_running, timeout=180)
            assert cluster.image.startswith(f"localhost/elastrain-{framework}"), cluster.image
            print(f"\ntiming: first job ({framework}): create -> 2 Running: {time.monotonic() - t0:.2f}s")
            yield c, name
        finally:
            c.delete_cluster(name)
            c.wait_deleted(name, timeout=90)


def test_the_suggested_first_job_succeeds(fresh: tuple[Client, str], ccp: ContainerPlane) -> None:
    c, name = fresh
    cluster = c.get_cluster(name)
    framework = cluster.framework
    # what the CLI prints after `cluster create` and what the portal's job box holds for this cluster
    command = first_job_command(cluster.desired_containers, cluster.gpus_per_container)
    assert command == first_job_command(2), command
    assert cluster.raw["first_job"] == command  # what the portal's job box holds

    t0 = time.monotonic()
    job = c.submit_job(name, shlex.split(command))
    assert job["command"] == shlex.split(command), job
    try:
        done = wait_until(
            lambda: (j := c.get_job(job["id"]))["status"] not in ("Pending", "Running") and j,
            240,
            f"the first job on {framework} to finish",
        )
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{c.job_logs(job['id'])[0][-4000:]}") from None
    seconds = time.monotonic() - t0
    log = c.job_logs(job["id"])[0]
    assert (done["status"], done["exit_code"]) == ("Succeeded", 0), f"{done}\n{log[-4000:]}"
    found = DONE.search(log)
    assert found and int(found.group(1)) > 0, log[-3000:]
    assert "elastrain: training finished" in log, log[-3000:]
    print(f"\ntiming: first job ({framework}): submit -> Succeeded: {seconds:.2f}s")
