"""gpu_type in the portal (issue 28 item 5), in a real chromium against a server with virtual GPUs of
two models (``--gpus A100:2,V100:2``): the create form offers each model with its free GPUs, the
default max follows the chosen model's GPUs, the cluster runs on that model's GPUs and its page shows
the type; asking for a model with none free is refused next to the GPU type field."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until
from tests.browser.conftest import sign_in, started

pytestmark = [pytest.mark.browser, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def typed_server(browser: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """Two A100s (ids 0-1) and two V100s (ids 2-3); cleaned up and stopped by PID."""
    made = ControlPlane(tmp_path_factory.mktemp("portal-gpu-types"), gpus="A100:2,V100:2")
    with started(made) as plane:
        yield plane


def fill_form(page: Any, url: str, name: str, model_label: str) -> None:
    page.goto(f"{url}/clusters/new")
    page.get_by_label("Cluster name").fill(name)
    page.get_by_label("Enable GPU").check()
    page.get_by_label("GPUs per container").fill("1")
    options = page.locator("#gpu-type option")
    wait_until(lambda: options.count() == 3, 10, "any, A100 and V100")
    page.get_by_label("GPU type").select_option(label=model_label)


def test_the_form_offers_each_model_and_the_page_shows_the_clusters(
    typed_server: ControlPlane, page: Any, shot: Callable[..., Path]
) -> None:
    plane = typed_server
    sign_in(page, plane.url, plane.token)
    try:
        fill_form(page, plane.url, "v", "V100: 2 of 2 free")
        # two V100s hold 2 containers of 1 GPU: the default max is 2 (not twice the containers)
        wait_until(lambda: page.get_by_label("Max containers").input_value() == "2", 10, "max 2")
        shot(page, "gpu-type-01-form")
        page.get_by_role("button", name="Submit").click()
        page.wait_for_url(f"{plane.url}/clusters/v")
        summary = page.locator("#cluster-summary")
        summary.filter(has_text=re.compile(r"GPU type\s*V100")).wait_for()
        summary.filter(has_text="2/2 Running").wait_for()
        gpus = page.locator("#containers-body td[data-label=GPUs]").all_inner_texts()
        assert sorted(gpus) == ["1 (2)", "1 (3)"]  # the V100s
        shot(page, "gpu-type-02-cluster")

        fill_form(page, plane.url, "v2", "V100: 0 of 2 free")
        page.get_by_role("button", name="Submit").click()
        error = page.locator("#gpu-type-error")
        error.wait_for(state="visible")
        assert "0 of this node's 2 are free now" in error.inner_text()
    finally:
        with plane.client() as c:
            c.delete_cluster("v")
            c.wait_deleted("v")
