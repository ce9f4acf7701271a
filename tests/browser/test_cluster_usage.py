"""The cluster page's resource figures in a real chromium (process backend): one row per Running
container with its CPU % and memory in use (of the cluster's limit: the server's default per container
when it asked for none), and "no GPUs" where NVML cannot start or the GPUs are virtual; the create
form's GPU type offers "any". Screenshot:
artifacts/screenshots/cluster-usage.png.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.clusters import all_running
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.browser.conftest import sign_in

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


def test_cluster_page_shows_each_containers_resource_figures(
    server: ControlPlane, page: Any, shot: Callable[..., Path]
) -> None:
    with server.client() as c:
        c.create_cluster("figures", containers=2, gpus_per_container=1)
        cluster = c.wait_cluster("figures", all_running)
    names = sorted(k.name for k in cluster.containers)
    sign_in(page, server.url, server.token)
    page.goto(f"{server.url}/clusters/figures")
    rows = page.locator("#usage-body tr")

    def measured() -> bool:
        cpu = [rows.nth(i).locator(".usage-cpu").inner_text() for i in range(rows.count())]
        return len(cpu) == len(names) and all(re.fullmatch(r"\d+\.\d\s%", text) for text in cpu)

    wait_until(measured, 30, "a CPU % for every container")
    assert sorted(rows.nth(i).get_attribute("data-container") for i in range(rows.count())) == names
    for i in range(rows.count()):
        row = rows.nth(i)
        assert row.get_attribute("data-source") == "processes"
        # created without --memory: the server's default limit per container (half this machine's memory)
        memory = row.locator(".usage-memory").inner_text()
        assert re.fullmatch(r"[\d.]+\s(KiB|MiB|GiB) / [\d.]+\s(GiB|TiB)", memory), memory
        assert row.locator(".usage-gpu").inner_text().startswith("no GPUs")  # virtual GPUs: no device to read
    shot(page, "cluster-usage")

    page.goto(f"{server.url}/clusters/new")
    page.get_by_label("Enable GPU").check()
    options = page.locator("#gpu-type option")
    wait_until(lambda: options.count() > 0, 10, "the GPU types to load")
    assert options.first.get_attribute("value") == "" and options.first.inner_text().startswith("any ")
    with server.client() as c:
        c.delete_cluster("figures")
        c.wait_deleted("figures")
