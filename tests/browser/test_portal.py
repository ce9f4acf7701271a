"""The web portal in a real chromium against a real `elastrain server` (the seed's click-by-click flow).

Sign in, create a 2-container Horovod cluster through the form, watch both containers go Running
without a reload, submit a job through the form, type the example job's `elastrain run` in the
launcher terminal, scale 2 -> 4 in the scale panel while it trains (the hostfile and the job's
world-size chart follow: 2 -> 4), delete the cluster; plus the refusals:
a wrong token, invalid form input (errors next to the fields), another user's cluster ("not found").
Screenshots of every page go to artifacts/screenshots/.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.jobs import REPO
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.browser.conftest import DESKTOP, PHONE, sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]

# The seed's command, typed in the launcher terminal: the example trains long enough to be scaled.
RUN_EXAMPLE = (
    "elastrain run -v --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile --join-grace 1 "
    "--checkpoint-dir /data/ckpt --checkpoint-every 40 "
    "python /data/mnist_elastic.py --epochs 200 --batch-size 250 --step-sleep 0.05"
)


def tokyo_and_utc(stamp: str) -> tuple[str, str]:
    """How the portal shows the RFC 3339 time `stamp` in an en-US browser in Tokyo (UTC+9): the local
    time as `toLocaleString` writes it, and its title, the UTC value as `toISOString` writes it."""
    when = datetime.fromisoformat(stamp)
    assert when.utcoffset() == timedelta(0), f"{stamp} is not UTC with its zone"
    millis = when.microsecond // 1000
    utc = when.strftime("%Y-%m-%dT%H:%M:%S") + (f".{millis:03d}" if millis else "") + "Z"
    local = when.astimezone(timezone(timedelta(hours=9)))
    clock = f"{local.hour % 12 or 12}:{local:%M:%S} {'AM' if local.hour < 12 else 'PM'}"
    return f"{local.month}/{local.day}/{local.year}, {clock}", utc


def _containers(tab: Any, state: str) -> Any:
    return tab.locator("#containers-body tr").filter(has=tab.locator(f".state-{state.lower()}"))


def test_wrong_token_shows_an_error(server: ControlPlane, page: Any, shot: Callable[..., Path]) -> None:
    page.goto(f"{server.url}/clusters")
    page.wait_for_url(re.compile(r"/signin\?next="))  # no token: every page sends you to sign in
    page.get_by_label("API token").fill("et_not-a-real-token")
    page.get_by_role("button", name="Sign in").click()
    error = page.locator("#token-error")
    error.wait_for(state="visible")
    assert "not accepted" in error.inner_text() and "unknown token" in error.inner_text()
    assert page.url.startswith(f"{server.url}/signin")
    assert page.get_by_role("button", name="Sign out").is_hidden()
    shot(page, "01-signin-wrong-token")


def test_create_scale_job_terminal_delete(
    server: ControlPlane, page: Any, shot: Callable[..., Path], browser: Any
) -> None:
    data = server.mounts / "data"
    data.mkdir(exist_ok=True)
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(REPO / "examples" / name, data / name)
    sign_in(page, server.url, server.token)
    page.get_by_role("heading", name="Distributed training clusters").wait_for()
    shot(page, "02-clusters-empty")

    # Create: the seed's fields, filled by label.
    page.get_by_role("link", name="Create cluster").click()
    page.wait_for_url(f"{server.url}/clusters/new")
    page.get_by_label("Horovod").check()
    page.get_by_label("Cluster name").fill("tthvd")
    page.get_by_label("Containers", exact=True).fill("2")
    page.get_by_label("Enable GPU").check()
    page.get_by_label("GPUs per container").fill("1")
    assert "8 free" in page.get_by_label("GPU type").inner_text()
    page.get_by_label("Enable shared memory").check()
    page.get_by_label("Shared memory size").fill("1Gi")
    page.get_by_label("Host path").fill(str(data))
    page.get_by_label("Mount at").fill("/data")
    shot(page, "03-create-form")
    page.get_by_role("button", name="Submit").click()

    # The cluster page: containers go Pending -> Running without a reload.
    page.wait_for_url(f"{server.url}/clusters/tthvd")
    page.evaluate("window.__noReload = true")
    wait_until(lambda: _containers(page, "Running").count() == 2, 30, "2 Running containers")
    assert page.evaluate("window.__noReload") is True
    roles = page.locator("#containers-body tr td[data-label=Role]").all_inner_texts()
    assert roles == ["launcher", "worker"]
    assert page.locator("#containers-body td[data-label=GPUs]").first.inner_text().startswith("1")
    page.locator("#hostfile").filter(has_text="slots=1").wait_for()
    assert "Created with 2 containers (horovod)" in page.locator("#events-body").inner_text()
    shot(page, "04-cluster-running")

    # Times are shown in the browser's zone with the UTC value in the title: in a Tokyo browser, the
    # "created" event's time reads 9 hours ahead of the API's `at`.
    with server.client() as c:
        created = next(e for e in c.events("tthvd") if e["action"] == "cluster.created")
    tokyo = browser.new_context(viewport=DESKTOP, timezone_id="Asia/Tokyo", locale="en-US")
    try:
        tab = tokyo.new_page()
        sign_in(tab, server.url, server.token)
        tab.goto(f"{server.url}/clusters/tthvd")
        shown = tab.locator("#events-body tr").filter(has_text="Created with 2 containers").locator("time")
        text = shown.inner_text().replace("\u202f", " ")  # ICU puts a narrow space before AM/PM
        assert (text, shown.get_attribute("title")) == tokyo_and_utc(created["at"]), created
    finally:
        tokyo.close()

    # The job form runs a command detached in the launcher container; its page shows how it ended.
    page.get_by_label("Command").fill("echo submitted-from-the-form")
    page.get_by_role("button", name="Submit job").click()
    page.wait_for_url(re.compile(r"/jobs/\d+$"))
    page.locator("#job-log").filter(has_text="submitted-from-the-form").wait_for()
    page.locator("#job-status").filter(has_text="Succeeded").wait_for()

    # The launcher terminal (the seed's JupyterLab -> Terminal): a real shell in the container; the
    # example job typed there registers itself as a job of the cluster and charts its progress.
    page.goto(f"{server.url}/clusters/tthvd/terminal")
    page.get_by_text("Connected to the launcher container.").wait_for()
    page.locator(".xterm").click()
    page.keyboard.type("echo role=$ELASTRAIN_CONTAINER_ROLE hosts=$(grep -c slots= etc/mpi/hostfile)\n")
    page.locator(".xterm-rows").filter(has_text="role=launcher hosts=2").wait_for()
    page.keyboard.type(f"{RUN_EXAMPLE}\n")
    started = page.locator(".xterm-rows").filter(has_text=re.compile(r"this run is job \d+"))
    started.wait_for(timeout=30_000)
    found = re.search(r"this run is job (\d+)", started.inner_text())
    assert found, started.inner_text()
    job_url = f"{server.url}/jobs/{found.group(1)}"
    page.locator(".xterm-rows").filter(has_text="formed: 2 workers").wait_for(timeout=60_000)
    shot(page, "05-terminal-job")

    page.goto(f"{server.url}/clusters/tthvd")
    page.locator(f"#jobs-body tr[data-job='{found.group(1)}']").get_by_role("link").click()
    page.wait_for_url(job_url)
    page.locator("#job-log").filter(has_text="formed: 2 workers").wait_for()
    summary = page.locator("#job-summary")
    wait_until(lambda: re.search(r"World size\s+2", summary.inner_text()), 60, "world size 2 on the job page")
    page.locator("#chart-world canvas").wait_for()
    shot(page, "06-job-world-2")

    # Scale 2 -> 4 from the list while the job runs: check the row, "Scale containers", confirm.
    page.goto(f"{server.url}/clusters")
    row = page.locator("#clusters-body tr[data-cluster=tthvd]")
    row.get_by_label("Select cluster tthvd").check()
    page.get_by_role("button", name="Scale containers").click()
    panel = page.get_by_role("dialog", name="Scale containers")
    panel.get_by_label("Container count").fill("4")
    shot(page, "07-scale-panel")
    panel.get_by_role("button", name="Confirm").click()
    wait_until(lambda: row.locator(".containers").inner_text() == "4/4", 30, "4/4 containers in the list")
    assert row.locator("td[data-label=GPUs]").inner_text() == "4"
    shot(page, "08-clusters-scaled")

    page.get_by_role("link", name="tthvd").click()
    wait_until(lambda: _containers(page, "Running").count() == 4, 30, "4 Running containers")
    hostfile = page.locator("#hostfile")
    wait_until(lambda: hostfile.inner_text().count("slots=1") == 4, 20, "4 hosts in the hostfile")
    generation = page.locator("#hostfile-generation").inner_text()
    found_generation = re.search(r"\d+", generation)
    assert found_generation and int(found_generation.group()) >= 2, generation
    events = page.locator("#events-body").inner_text()
    # elastic by default: the scheduler may have grown the cluster into the idle GPUs (the job's range
    # is 2..4) before the scale panel's request, which then changed nothing
    grown = ("Scaled from 2 to 4 containers.", "The scheduler grew it from 2 to 4 containers")
    assert any(text in events for text in grown), events
    shot(page, "09-cluster-scaled")

    # The running job grew into the new containers: world size 2 -> 4 on the chart, marked as resizes.
    page.goto(job_url)
    resizes = page.locator("#resize-list li")  # 2 -> 4, or 2 -> 3 -> 4 when the workers come up apart
    resizes.filter(has_text=re.compile(r"world size \d → 4")).wait_for(timeout=90_000)
    assert "world size 2 →" in resizes.first.inner_text()
    page.locator("#job-log").filter(has_text="formed: 4 workers").wait_for()
    page.locator("#checkpoints-body tr").first.wait_for()  # every 40 steps, listed as the container sees it
    assert "/data/ckpt/ckpt-" in page.locator("#checkpoints-body").inner_text()
    shot(page, "10-job-resized")

    # Phone width: the cluster page stacks its tables.
    phone = browser.new_context(viewport=PHONE)
    try:
        tab = phone.new_page()
        sign_in(tab, server.url, server.token)
        tab.goto(f"{server.url}/clusters/tthvd")
        wait_until(lambda: _containers(tab, "Running").count() == 4, 20, "4 Running on the phone")
        width = tab.evaluate("document.documentElement.scrollWidth")
        assert width <= PHONE["width"], f"the page scrolls sideways on a phone ({width}px)"
        shot(tab, "11-cluster-phone")
    finally:
        phone.close()

    # Delete with confirmation: Cancel keeps it, Delete removes it.
    page.goto(f"{server.url}/clusters/tthvd")
    page.get_by_role("button", name="Delete cluster").click()
    page.get_by_role("button", name="Cancel").click()
    assert page.url.endswith("/clusters/tthvd")
    page.get_by_role("button", name="Delete cluster").click()
    shot(page, "12-delete-confirm")
    page.locator("#delete-dialog").get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{server.url}/clusters")
    page.locator("#clusters-empty").wait_for(timeout=30_000)
    with server.client() as c:
        assert c.list_clusters() == []


def test_invalid_input_shows_field_errors(server: ControlPlane, page: Any, shot: Callable[..., Path]) -> None:
    sign_in(page, server.url, server.token)
    page.goto(f"{server.url}/clusters/new")

    def submit_and_expect(field: str, text: str) -> None:
        page.get_by_role("button", name="Submit").click()
        error = page.locator(f"#{field}-error")
        error.filter(has_text=text).wait_for()
        assert page.url.endswith("/clusters/new")

    page.get_by_label("Cluster name").fill("Bad_Name")
    submit_and_expect("name", "not a DNS label")
    assert page.get_by_label("Cluster name").get_attribute("aria-invalid") == "true"
    shot(page, "13-create-invalid-name")
    page.get_by_label("Cluster name").fill("ok")
    page.get_by_label("Containers", exact=True).fill("1")
    submit_and_expect("containers", "at least 2")
    assert page.locator("#name-error").is_hidden()
    shot(page, "14-create-invalid-containers")
    page.get_by_label("Containers", exact=True).fill("2")
    page.get_by_label("Enable GPU").check()
    page.get_by_label("GPUs per container").fill("5")
    submit_and_expect("gpus", "this node has 8")
    page.get_by_label("GPUs per container").fill("1")
    page.get_by_label("Enable shared memory").check()
    page.get_by_label("Shared memory size").fill("lots")
    submit_and_expect("shm", "not understood")
    page.get_by_label("Shared memory size").fill("1Gi")
    page.get_by_label("Host path").fill("/definitely/not/here")  # 403: outside --allow-mount (no probing)
    submit_and_expect("mounts", "outside the allowed roots")
    page.get_by_label("Host path").fill(str(server.mounts / "not-here"))  # 409: inside, but missing
    submit_and_expect("mounts", "does not exist")
    with server.client() as c:
        assert "ok" not in [k.name for k in c.list_clusters()], "a refused form must not create a cluster"


def test_other_users_cluster_is_not_found(server: ControlPlane, page: Any, shot: Callable[..., Path]) -> None:
    with server.client() as admin:
        bob = admin.create_user("bob")
        admin.create_cluster("private", containers=2)
    try:
        sign_in(page, server.url, bob)
        assert page.locator("#clusters-body tr").count() == 0
        page.goto(f"{server.url}/clusters/private")
        page.locator("#page-error").filter(has_text="Cluster “private” not found.").wait_for()
        assert page.locator("#cluster-view").is_hidden()
        shot(page, "15-other-users-cluster")
    finally:
        with server.client() as admin:
            admin.delete_cluster("private")
            admin.wait_deleted("private", timeout=30)
