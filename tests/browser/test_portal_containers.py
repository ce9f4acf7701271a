"""The seed's flow in a real chromium against `elastrain server --backend container` (podman).

Create a 2-container PyTorch cluster through the form (the image select lists the images podman holds,
left on the framework's default), open the launcher terminal (a shell in the launcher container as the
tenant: the hostfile names the containers, the uid is not root), type the elastic example's
`elastrain run`, scale 2 -> 4 in the scale panel while it trains (the job's world size follows), and
delete the cluster from the portal: no container of the server is left. Skipped (with the reason)
where podman cannot run containers or chromium is missing. Screenshots: artifacts/screenshots/containers-*.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.containers import ContainerPlane, server_containers
from elastrain.testing.jobs import REPO
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.browser.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(600)]

# The seed's command, typed in the launcher terminal.
RUN_EXAMPLE = (
    "elastrain run --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile "
    "python /data/mnist_elastic.py --epochs 30 --batch-size 200 --step-sleep 0.02"
)


def _running(tab: Any) -> int:
    return int(tab.locator("#containers-body tr").filter(has=tab.locator(".state-running")).count())


def _world_size(tab: Any) -> int | None:
    found = re.search(r"World size\s+(\d+)", tab.locator("#job-summary").inner_text())
    return int(found.group(1)) if found else None


def test_seed_flow_on_containers(
    container_server: ContainerPlane, page: Any, shot: Callable[..., Path]
) -> None:
    server = container_server
    data = server.mounts / "data"
    data.mkdir(exist_ok=True)
    data.chmod(0o777)  # the tenant's uid reads it (and the job may write there)
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(REPO / "examples" / name, data / name)
    sign_in(page, server.url, server.token)

    # 1. The create form: the image select lists podman's images; a framework no image holds says how
    # to build one, and the API's refusal shows in the form.
    page.get_by_role("link", name="Create cluster").click()
    page.wait_for_url(f"{server.url}/clusters/new")
    select = page.get_by_label("Image")
    options = select.locator("option")
    wait_until(lambda: options.count() > 1, 20, "the image list in the select")
    texts = options.all_inner_texts()
    assert texts[0] == "default image of the framework" and select.input_value() == ""
    pytorch = [t for t in texts if t.startswith("localhost/elastrain-pytorch")]
    assert pytorch and all(re.search(r" — PyTorch, [\d.]+ [KMGT]B$", t) for t in pytorch), texts
    page.get_by_label("Cluster name").fill("seed")
    # Horovod on the pytorch image: the note says the image does not fit (or, where no image holds
    # horovod yet, how to build one), and the API refuses the pair
    page.get_by_label("Horovod").check()
    select.select_option(pytorch[0].split(" — ")[0])
    note = page.locator("#image-note")
    note.filter(has_text=re.compile(r"does not hold horovod|no image holds horovod yet")).wait_for()
    page.get_by_role("button", name="Submit").click()
    errors = page.locator("#framework-error, #image-error")
    errors.filter(has_text=re.compile(r"holds pytorch, not horovod")).first.wait_for()
    assert page.url.endswith("/clusters/new")

    page.get_by_label("PyTorch").check()
    select.select_option("")
    note.filter(has_text="default for pytorch: localhost/elastrain-pytorch").wait_for()
    assert page.locator("#framework-error").is_hidden()  # the refusal was about the other framework
    page.get_by_label("Containers", exact=True).fill("2")
    page.get_by_label("Enable shared memory").check()
    page.get_by_label("Shared memory size").fill("256Mi")
    page.get_by_label("Host path").fill(str(data))
    page.get_by_label("Mount at").fill("/data")
    assert select.input_value() == ""  # left on the framework's default
    shot(page, "containers-create")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(f"{server.url}/clusters/seed")
    wait_until(lambda: _running(page) == 2, 120, "2 Running containers")
    page.locator("#cluster-summary").filter(has_text="localhost/elastrain-pytorch").wait_for()
    roles = page.locator("#containers-body tr td[data-label=Role]").all_inner_texts()
    assert roles == ["launcher", "worker"]
    assert len(server_containers(server.key)) == 2
    shot(page, "containers-cluster")

    # 2. The launcher terminal: a shell in the launcher container, as the tenant.
    page.get_by_role("link", name="Open terminal").click()
    page.wait_for_url(f"{server.url}/clusters/seed/terminal")
    page.get_by_text("Connected to the launcher container.").wait_for()
    rows = page.locator(".xterm-rows")
    wait_until(lambda: re.search(r"[$#]\s*$", rows.inner_text(), re.M), 30, "the shell's prompt")
    page.locator(".xterm").click()
    page.keyboard.type("cat /etc/mpi/hostfile\n")
    rows.filter(has_text="seed-launcher slots=1").wait_for()
    rows.filter(has_text="seed-worker-0 slots=1").wait_for()
    page.keyboard.type("id -u\n")
    uid = wait_until(lambda: re.search(r"^(\d+)\s*$", rows.inner_text(), re.M), 20, "the output of id -u")
    assert int(uid.group(1)) >= 20000, rows.inner_text()  # the tenant's uid, not root

    # 3. The seed's elastic job, typed in the terminal, registers itself as a job of the cluster.
    page.keyboard.type(f"{RUN_EXAMPLE}\n")
    started = rows.filter(has_text=re.compile(r"this run is job \d+"))
    started.wait_for(timeout=60_000)
    found = re.search(r"this run is job (\d+)", started.inner_text())
    assert found, started.inner_text()
    job_id = found.group(1)
    shot(page, "containers-terminal")

    page.goto(f"{server.url}/clusters/seed")
    job_row = page.locator(f"#jobs-body tr[data-job='{job_id}']")
    job_row.wait_for()
    wait_until(
        lambda: job_row.locator("td[data-label='World size']").inner_text() == "2",
        120,
        "the job training with world size 2 in the cluster's job list",
    )
    assert "Running" in job_row.inner_text()

    # 4. Scale 2 -> 4 in the cluster page's scale panel; the running job grows to 4.
    page.get_by_role("button", name="Scale containers").click()
    panel = page.get_by_role("dialog", name="Scale containers")
    panel.get_by_label("Container count").fill("4")
    panel.get_by_role("button", name="Confirm").click()
    wait_until(lambda: _running(page) == 4, 120, "4 Running containers")
    hostfile = page.locator("#hostfile")
    wait_until(lambda: hostfile.inner_text().count("slots=1") == 4, 30, "4 hosts in the hostfile")

    page.goto(f"{server.url}/jobs/{job_id}")
    page.locator("#job-status").filter(has_text="Running").wait_for()
    wait_until(lambda: _world_size(page) == 4, 120, "world size 4 on the job page")
    page.locator("#resize-list li").filter(has_text=re.compile(r"world size \d → 4")).first.wait_for()
    assert "world size 2 →" in page.locator("#resize-list li").first.inner_text()
    page.locator("#chart-world canvas").wait_for()
    shot(page, "containers-job")

    # 5. Delete from the portal: the cluster and every container of the server are gone.
    page.goto(f"{server.url}/clusters/seed")
    page.get_by_role("button", name="Delete cluster").click()
    page.locator("#delete-dialog").get_by_role("button", name="Delete").click()
    page.wait_for_url(f"{server.url}/clusters")
    page.locator("#clusters-empty").wait_for(timeout=60_000)
    with server.client() as c:
        assert c.list_clusters() == []
    wait_until(lambda: server_containers(server.key) == [], 60, "no container of the server left")


def test_process_backend_lists_its_one_image(server: ControlPlane, page: Any) -> None:
    """The counterpart on `--backend process`: the select holds the default and "local" (any framework)."""
    sign_in(page, server.url, server.token)
    page.goto(f"{server.url}/clusters/new")
    options = page.get_by_label("Image").locator("option")
    wait_until(lambda: options.count() > 1, 20, "the image list in the select")
    texts = options.all_inner_texts()
    assert len(texts) == 2 and texts[0] == "default image of the framework", texts
    assert texts[1].startswith("local — any framework"), texts
    page.get_by_label("DeepSpeed").check()
    page.locator("#image-note").filter(has_text="default for deepspeed: local").wait_for()
