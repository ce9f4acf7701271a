"""The portal offers elasticity (issue 28 item 4), in a real chromium against a real server with four
virtual GPUs and the elastic scheduler (named explicitly: it stays right whatever the default is).

Create a cluster in the form, leaving the elastic defaults (2 containers, min 2, max 4: twice the
containers within the node's GPUs); its page shows the bounds, and the job box's first job carries the
same worker range as the "Run training" hint (``--min-np 2 --max-np 4``). Submit it (longer, so it is
still training): the cluster grows into the two idle GPUs, the page says so in words, the job's world
grows to 4. Another tenant then creates a 2-GPU cluster: ours shrinks back to its minimum for it, the
page gives the reason, the events read as sentences, and the job goes on with 2 workers.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.browser.conftest import sign_in, started

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]
RANGE = "--min-np 2 --max-np 4"


@pytest.fixture(scope="module")
def elastic_server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A server of its own: 4 virtual GPUs, ``--scheduler elastic``; cleaned up and stopped by PID."""
    made = ControlPlane(
        tmp_path_factory.mktemp("portal-elastic"), gpus=4, extra_args=("--scheduler", "elastic")
    )
    with started(made) as plane:
        yield plane


def _api(plane: ControlPlane, token: str) -> httpx.Client:
    return httpx.Client(
        base_url=plane.url + "/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=30
    )


def _summary(page: Any, term: str) -> str:
    """The text of one `<dd>` of the cluster page's summary."""
    return str(
        page.locator("#cluster-summary dt", has_text=re.compile(f"^{term}$")).locator("+ dd").inner_text()
    )


def test_create_with_bounds_then_the_job_grows_and_shrinks_for_another_tenant(
    elastic_server: ControlPlane, page: Any, shot: Callable[..., Path]
) -> None:
    plane = elastic_server
    admin = _api(plane, plane.token)
    made = admin.post("/users", json={"name": "bob"})
    assert made.status_code == 201, made.text
    bob = _api(plane, made.json()["token"])
    try:
        sign_in(page, plane.url, plane.token)
        page.goto(f"{plane.url}/clusters/new")
        page.get_by_label("Cluster name").fill("grow")
        page.get_by_label("Enable GPU").check()
        page.get_by_label("GPUs per container").fill("1")
        page.get_by_label("Containers", exact=True).fill("2")
        wait_until(lambda: page.get_by_label("Max containers").input_value() == "4", 20, "the default max 4")
        assert page.get_by_label("Min containers").input_value() == "2"
        assert page.get_by_label("Priority").input_value() == "0"
        shot(page, "elastic-01-create-form")
        page.get_by_role("button", name="Submit").click()
        page.wait_for_url(f"{plane.url}/clusters/grow")

        box = page.get_by_label("Command")
        wait_until(lambda: RANGE in box.input_value(), 30, f"{RANGE} in the job box")
        assert f"horovodrun {RANGE} --hostfile /etc/mpi/hostfile" in _summary(page, "Run training")
        assert "elastic between 2 and 4" in _summary(page, "Size")
        cluster = admin.get("/clusters/grow").json()
        assert (cluster["min_containers"], cluster["max_containers"], cluster["priority"]) == (2, 4, 0)

        # a job starts in a Running launcher (before that the API answers 409 and the form says so)
        wait_until(
            lambda: admin.get("/clusters/grow").json()["state"] == "Running", 60, "the cluster Running"
        )
        box.fill(box.input_value() + " --epochs 400")  # trains long enough to be resized twice
        page.get_by_role("button", name=re.compile(r"^Submit job")).click()
        page.wait_for_url(re.compile(rf"{re.escape(plane.url)}/jobs/\d+$"))
        job_id = int(page.url.rsplit("/", 1)[1])
        job = lambda: admin.get(f"/jobs/{job_id}").json()  # noqa: E731
        page.goto(f"{plane.url}/clusters/grow")

        size = lambda: _summary(page, "Size")  # noqa: E731
        wait_until(
            lambda: size().startswith("4 containers") and "grown into 2 idle GPUs" in size(), 60, "grown"
        )
        wait_until(lambda: job()["world_size"] == 4, 120, "the job at world size 4")
        events = page.locator("#events-body")
        wait_until(lambda: "The scheduler" in events.inner_text(), 20, "the scheduler's event")
        shot(page, "elastic-02-grown")

        other = bob.post("/clusters", json={"name": "other", "containers": 2, "gpus_per_container": 1})
        assert other.status_code == 201, other.text
        wait_until(lambda: size().startswith("2 containers"), 60, "shrunk to its minimum")
        assert "shrunk for cluster other" in size()
        wait_until(
            lambda: "shrank it from 4 to 2 containers: shrunk for cluster other" in events.inner_text(),
            20,
            "the shrink as a sentence",
        )
        assert "=" not in events.inner_text()  # sentences, not key=value strings
        wait_until(lambda: job()["world_size"] == 2, 120, "the job back at world size 2")
        assert job()["status"] == "Running"
        shot(page, "elastic-03-shrunk")
    finally:
        for client, name in ((admin, "grow"), (bob, "other")):
            client.delete(f"/clusters/{name}")
        for client, name in ((admin, "grow"), (bob, "other")):
            wait_until(
                lambda c=client, n=name: c.get(f"/clusters/{n}").status_code == 404, 60, f"{name} gone"
            )
        admin.close()
        bob.close()
