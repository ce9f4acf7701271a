"""JupyterLab in the launcher container, reached through the portal (`elastrain server --backend container`).

The owner opens the cluster page, clicks "Open JupyterLab" (a new tab on ``/clusters/<name>/lab/``),
opens a Terminal in JupyterLab and types the first job's `elastrain run`: the terminal is a shell in the
launcher container (its hostname, the tenant's uid, /etc/mpi/hostfile) and the job trains there on
both containers. A notebook's kernel (binary WebSocket frames with a subprotocol) answers from the
launcher too. Over plain HTTP: another tenant and an unknown cluster get 404, no credential 401, a
cross-site POST 403, and JupyterLab's token never reaches the browser. On the process backend the lab
URL says why there is none (501). Skipped (with the reason) without podman or chromium.

With ``ELASTRAIN_SCREENSHOTS=docs/img`` the README's screenshot is written there (jupyterlab.png).
"""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from elastrain.examples import first_job_command
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import ContainerPlane
from elastrain.testing.jobs import REPO
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.browser.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

SCREENSHOTS_ENV = "ELASTRAIN_SCREENSHOTS"  # a directory (relative to the repo) for the README's images
TERMINAL_SETTINGS = "lab/api/settings/@jupyterlab/terminal-extension:plugin"


try:  # the type of a locator's timeout (the module is skipped below without playwright)
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
except ImportError:  # pragma: no cover - the browser fixture skips these tests then
    PlaywrightTimeout = TimeoutError  # type: ignore[misc,assignment]


def _lab_answers(url: str, headers: dict[str, str]) -> httpx.Response | None:
    answer = httpx.get(url, headers=headers, timeout=30)
    return answer if answer.status_code == 200 else None


def _readme_screenshot(tab: Any) -> None:
    where = os.environ.get(SCREENSHOTS_ENV)
    if where:
        target = Path(where) if Path(where).is_absolute() else REPO / where
        target.mkdir(parents=True, exist_ok=True)
        tab.screenshot(path=str(target / "jupyterlab.png"))


def test_jupyterlab_terminal_runs_the_first_job(
    container_server: ContainerPlane, page: Any, shot: Callable[..., Path]
) -> None:
    server = container_server
    with server.client() as admin:
        admin.create_cluster("lab", framework="pytorch", containers=2)
        admin.wait_cluster("lab", all_running, timeout=120)
        bob = admin.create_user("lab-bob")
    lab_url = f"{server.url}/clusters/lab/lab/"
    owner = {"Authorization": f"Bearer {server.token}"}
    lab_token = (server.data / "clusters" / "lab" / "lab-token").read_text().strip()

    # 1. Over HTTP: the owner gets JupyterLab's page (its token nowhere in it); nobody else gets anything.
    answer = wait_until(lambda: _lab_answers(lab_url + "lab", owner), 90, "JupyterLab to answer")
    assert "JupyterLab" in answer.text and lab_token not in answer.text
    assert answer.headers.get("access-control-allow-origin") is None
    assert httpx.get(lab_url, headers={"Authorization": f"Bearer {bob}"}).status_code == 404
    assert httpx.get(f"{server.url}/clusters/nosuch/lab/", headers=owner).status_code == 404
    anonymous = httpx.get(lab_url + "lab", headers={"Accept": "text/html"})
    assert anonymous.status_code == 401 and "open JupyterLab from the cluster" in anonymous.text
    cross_site = httpx.post(lab_url + "api/terminals", headers={**owner, "Origin": "http://evil.example"})
    assert cross_site.status_code == 403
    # xterm draws on a canvas; in screen-reader mode its rows are in the DOM too (a PUT through the proxy)
    settings = httpx.put(
        lab_url + TERMINAL_SETTINGS, headers=owner, json={"raw": '{"screenReaderMode": true}'}
    )
    assert settings.status_code == 204, settings.text

    # 2. The cluster page's button opens JupyterLab in a new tab; its cookie is not for scripts.
    sign_in(page, server.url, server.token)
    page.goto(f"{server.url}/clusters/lab")
    wait_until(lambda: page.locator("#containers-body .state-running").count() == 2, 60, "2 Running")
    with page.context.expect_page() as opened:
        page.get_by_role("button", name="Open JupyterLab").click()
    lab = opened.value
    lab.set_default_timeout(60_000)
    lab.wait_for_url(re.compile(r"/clusters/lab/lab/lab"))
    cookie = next(c for c in lab.context.cookies() if c["name"] == "elastrain_lab")
    assert cookie["httpOnly"] and cookie["sameSite"] == "Strict" and cookie["path"] == "/clusters/lab/lab/"
    assert "elastrain_lab" not in lab.evaluate("document.cookie")
    assert lab.evaluate("sessionStorage.getItem('elastrain-token')") is None  # it stays in the portal tab
    assert server.token not in lab.url

    # 3. JupyterLab's Terminal is a shell in the launcher container, as the tenant, in their home.
    lab.locator(".jp-Launcher-section", has_text="Other").locator(
        ".jp-LauncherCard", has_text="Terminal"
    ).click()
    rows = lab.locator(".jp-Terminal .xterm-accessibility-tree")
    wait_until(lambda: re.search(r"[$#]\s*$", rows.inner_text(), re.M), 60, "the terminal's prompt")
    lab.locator(".jp-Terminal .xterm-screen").click()
    lab.keyboard.type("cat /etc/mpi/hostfile; echo host=$(hostname) uid=$(id -u) at=$(pwd)\n")
    rows.filter(has_text="lab-worker-0 slots=1").wait_for()
    found = wait_until(lambda: re.search(r"host=(\S+) uid=(\d+) at=(\S+)", rows.inner_text()), 30, "id")
    assert found.group(1) == "lab-launcher" and int(found.group(2)) >= 20000, found.group(0)
    assert found.group(3).startswith("/home/"), found.group(0)
    lab.keyboard.type(first_job_command(2) + "\n")
    rows.filter(has_text=re.compile(r"epoch \d+ done: world 2")).first.wait_for(timeout=120_000)
    rows.filter(has_text="first job done").wait_for(timeout=120_000)
    assert lab.get_by_text("official Jupyter news").count() == 0  # offline: never asked (overrides.json)
    shot(lab, "jupyterlab-terminal")
    _readme_screenshot(lab)

    # 4. A notebook's kernel runs in the launcher too (kernel WebSocket: binary frames, a subprotocol).
    lab.locator(".lm-MenuBar-itemLabel", has_text="File").click()
    lab.locator(".lm-Menu-itemLabel", has_text="New Launcher").click()
    lab.locator(".jp-Launcher-section", has_text="Notebook").locator(".jp-LauncherCard").first.click()
    notebook = lab.locator(".jp-NotebookPanel")
    try:
        idle = notebook.locator(".jp-Notebook-ExecutionIndicator[data-status='idle']")
        idle.wait_for(timeout=120_000)  # the kernel started in the launcher and answered
        cell = notebook.locator(".jp-Cell .cm-content").first
        cell.click()
        lab.keyboard.type("import socket; print('kernel on', socket.gethostname())")
        wait_until(lambda: "gethostname" in cell.inner_text(), 10, "the code in the cell")
        output = notebook.locator(".jp-OutputArea-output", has_text="kernel on lab-launcher")
        # a run typed while JupyterLab still sets up the notebook's session may never be sent: run
        # the cell again then (Ctrl+Enter runs it in place)
        for _attempt in range(3):
            lab.keyboard.press("Control+Enter")
            with contextlib.suppress(PlaywrightTimeout):
                output.wait_for(timeout=30_000)
                break
            cell.click()
        output.wait_for(timeout=1_000)
    except Exception:
        shot(lab, "jupyterlab-kernel-failed")
        raise

    with server.client() as admin:
        admin.delete_cluster("lab")
        admin.wait_deleted("lab", timeout=90)


def test_the_process_backend_says_why_it_has_no_jupyterlab(server: ControlPlane) -> None:
    with server.client() as admin:
        admin.create_cluster("nolab", containers=2)
        admin.wait_cluster("nolab", all_running, timeout=60)
        headers = {"Authorization": f"Bearer {server.token}", "Accept": "text/html"}
        answer = httpx.get(f"{server.url}/clusters/nolab/lab/", headers=headers)
        assert answer.status_code == 501 and "--backend container" in answer.text
        problem = httpx.get(
            f"{server.url}/clusters/nolab/lab/api", headers={"Authorization": headers["Authorization"]}
        )
        assert problem.status_code == 501 and problem.json()["status"] == 501
        admin.delete_cluster("nolab")
        admin.wait_deleted("nolab")
