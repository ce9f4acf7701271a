"""The first thing a new user clicks works: on a fresh cluster the job box already holds a command that
trains, and submitting it unchanged runs a job to Succeeded.

A 2-container cluster is created through the API exactly as a new user's client would
(``{"name": ..., "containers": 2}``), its page opened in chromium; the box labelled "Command" holds the
shipped example with ``-np 2`` (`elastrain.examples.first_job_command`), "Submit job" opens
``/jobs/N``, and the API shows the job Running with steps, then Succeeded (the page says so too). On the
process backend (the default framework, Horovod) and on the container backend (the PyTorch image, where
the example comes from the image's own elastrain). Plus: the suggestion follows the cluster's size
until the user edits it. Timings are printed (``-s``).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from elastrain.examples import first_job_command
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import ContainerPlane
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.browser.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


@pytest.fixture
def api(server: ControlPlane) -> Iterator[httpx.Client]:
    """An HTTP client of the process-backend server, as the admin."""
    with _api(server) as client:
        yield client


def _api(plane: ControlPlane) -> httpx.Client:
    return httpx.Client(base_url=plane.url, headers={"Authorization": f"Bearer {plane.token}"}, timeout=30)


def _job(api: httpx.Client, job_id: int) -> dict[str, Any]:
    answer = api.get(f"/api/v1/jobs/{job_id}")
    assert answer.status_code == 200, answer.text
    job: dict[str, Any] = answer.json()
    if job["status"] not in ("Pending", "Running", "Succeeded"):
        log = api.get(f"/api/v1/jobs/{job_id}/logs").text
        raise AssertionError(f"job {job_id} is {job['status']} (exit {job.get('exit_code')}):\n{log[-4000:]}")
    return job


def submit_the_prefilled_job(
    plane: ControlPlane, page: Any, body: dict[str, Any], shot: Callable[..., Path], label: str
) -> dict[str, float]:
    """Create the cluster from `body`, submit the job box's command unchanged in the browser and follow
    the job to Succeeded; the cluster is deleted after. Returns the measured seconds."""
    name = body["name"]
    timings: dict[str, float] = {}
    with _api(plane) as api:
        t0 = time.monotonic()
        made = api.post("/api/v1/clusters", json=body)
        assert made.status_code in (200, 201), made.text
        try:
            sign_in(page, plane.url, plane.token)
            page.goto(f"{plane.url}/clusters/{name}")
            box = page.get_by_label("Command")
            expected = first_job_command(2)
            wait_until(lambda: box.input_value() == expected, 30, f"{expected!r} in the job box")
            wait_until(lambda: all_running(plane.client().get_cluster(name)), 120, "2 Running containers")
            timings["create -> 2 Running"] = time.monotonic() - t0
            shot(page, f"first-job-{label}-cluster")

            t0 = time.monotonic()
            page.get_by_role("button", name=re.compile(r"^Submit")).click()
            page.wait_for_url(re.compile(rf"{re.escape(plane.url)}/jobs/\d+$"))
            job_id = int(page.url.rsplit("/", 1)[1])
            job = _job(api, job_id)
            assert job["command"] == expected.split(), job  # submitted exactly as it stood

            running = wait_until(
                lambda: (j := _job(api, job_id))["status"] == "Running" and (j.get("step") or 0) > 0 and j,
                120,
                "the job Running with steps",
            )
            timings["submit -> Running with steps"] = time.monotonic() - t0
            assert running["world_size"] in (None, 2), running
            page.locator("#job-status").filter(has_text="Running").wait_for()
            done = wait_until(
                lambda: (j := _job(api, job_id))["status"] == "Succeeded" and j, 120, "Succeeded"
            )
            timings["submit -> Succeeded"] = time.monotonic() - t0
            assert done["exit_code"] == 0 and done["step"] >= running["step"], done
            log = api.get(f"/api/v1/jobs/{job_id}/logs").text
            assert "first job done: 128 steps" in log and "elastrain: training finished" in log, log[-3000:]
            page.locator("#job-status").filter(has_text="Succeeded").wait_for()
            shot(page, f"first-job-{label}-succeeded")
        finally:
            api.delete(f"/api/v1/clusters/{name}")
    for what, seconds in timings.items():
        print(f"\ntiming: first job ({label}): {what}: {seconds:.2f}s")
    return timings


def test_the_prefilled_job_succeeds_on_the_process_backend(
    server: ControlPlane, page: Any, shot: Callable[..., Path]
) -> None:
    submit_the_prefilled_job(server, page, {"name": "pc", "containers": 2}, shot, "process")


def test_the_suggestion_follows_the_size_until_edited(
    server: ControlPlane, page: Any, api: httpx.Client
) -> None:
    made = api.post("/api/v1/clusters", json={"name": "gp", "containers": 2, "gpus_per_container": 2})
    assert made.status_code in (200, 201), made.text
    try:
        sign_in(page, server.url, server.token)
        page.goto(f"{server.url}/clusters/gp")
        box = page.get_by_label("Command")
        wait_until(lambda: box.input_value() == first_job_command(2, 2), 30, "-np 4: 2 containers x 2 GPUs")
        assert "-np 4 " in box.input_value()

        scaled = api.patch("/api/v1/clusters/gp", json={"containers": 3})
        assert scaled.status_code == 200, scaled.text
        # the suggestion follows the cluster's bounds: at least its minimum, up to the size asked for
        low, high = scaled.json()["min_containers"], scaled.json()["max_containers"]
        assert high == 3 and scaled.json()["first_job"] == first_job_command(low, 2, high)
        wait_until(lambda: box.input_value() == first_job_command(low, 2, high), 30, "--max-np 6 after 3")
        assert "--max-np 6 " in box.input_value()

        box.fill("echo my own command")
        assert api.patch("/api/v1/clusters/gp", json={"containers": 2}).status_code == 200
        page.locator("#cluster-summary").filter(has_text=re.compile(r"/2 Running")).wait_for()
        time.sleep(1.5)  # another refresh or two: the user's text stays
        assert box.input_value() == "echo my own command"
    finally:
        api.delete("/api/v1/clusters/gp")


def test_the_prefilled_job_succeeds_in_pytorch_containers(
    container_server: ContainerPlane, page: Any, shot: Callable[..., Path]
) -> None:
    body = {"name": "pc", "containers": 2, "framework": "pytorch"}
    submit_the_prefilled_job(container_server, page, body, shot, "containers")
