"""The create form marks every bad field of one refusal at once (the 422's problem-details `errors`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.server import ControlPlane
from tests.browser.conftest import sign_in

pytestmark = pytest.mark.browser


def test_one_submit_marks_every_bad_field(server: ControlPlane, page: Any, shot: Callable[..., Path]) -> None:
    sign_in(page, server.url, server.token)
    page.goto(f"{server.url}/clusters/new")
    page.get_by_label("Cluster name").fill("Bad_Name")
    page.get_by_label("Containers", exact=True).fill("1")
    page.get_by_label("Enable shared memory").check()
    page.get_by_label("Shared memory size").fill("lots")
    page.get_by_role("button", name="Submit").click()
    page.locator("#shm-error").filter(has_text="not understood").wait_for()
    assert "not a DNS label" in page.locator("#name-error").inner_text()
    assert "at least 2" in page.locator("#containers-error").inner_text()
    for label in ("Cluster name", "Shared memory size"):
        assert page.get_by_label(label).get_attribute("aria-invalid") == "true", label
    assert page.get_by_label("Containers", exact=True).get_attribute("aria-invalid") == "true"
    assert page.locator("#form-error").is_hidden()
    assert page.evaluate("document.activeElement.id") == "name"  # the first bad field
    assert page.url.endswith("/clusters/new")
    shot(page, "15-create-every-bad-field")
    page.get_by_label("Cluster name").fill("fine")
    page.get_by_label("Containers", exact=True).fill("2")
    page.get_by_label("Shared memory size").fill("1Gi")
    page.get_by_role("button", name="Submit").click()
    page.wait_for_url(f"{server.url}/clusters/fine")
    with server.client() as c:
        c.delete_cluster("fine")
