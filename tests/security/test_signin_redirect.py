"""Issue 29 item 4: ``/signin?next=`` goes only to a path of the portal's own origin.

The attack: a link to the portal's sign-in page whose ``next`` sends the tenant, once signed in, to
another site (``/\\evil.example`` and ``/%09/evil.example`` passed the old "starts with one slash"
check; a browser reads both as ``//evil.example``). Every such ``next`` now goes to ``/`` (which
shows the clusters); a path of
the portal itself still works. Runs in a real chromium (skipped without it, as tests/browser).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.security.harness import start_server

pytestmark = pytest.mark.timeout(120)
ATTACKS = ["/%5Cevil.example", "/%09/evil.example", "//evil.example", "http://evil.example/", "/%5C%5Cevil"]


def signed_in_at(tab: Any, url: str, token: str, next_query: str) -> str:
    """Sign in through the form of ``/signin?next=<next_query>`` (already URL-encoded); where it lands."""
    tab.goto(f"{url}/signin?next={next_query}")
    tab.get_by_label("API token").fill(token)
    tab.get_by_role("button", name="Sign in").click()
    tab.wait_for_url(lambda landed: "/signin" not in landed)
    return str(tab.url)


@pytest.mark.attack("29.open-redirect")
def test_sign_in_never_redirects_off_the_portal(tmp_path: Path, browser: Any) -> None:
    with start_server(tmp_path) as server:
        context = browser.new_context()
        try:
            tab = context.new_page()
            for attack in ATTACKS:
                landed = signed_in_at(tab, server.url, server.token, attack)
                assert landed in (f"{server.url}/", f"{server.url}/clusters"), (attack, landed)
            own = signed_in_at(tab, server.url, server.token, "%2Fclusters%2Fx%3Ftab%3Djobs")
            assert own == f"{server.url}/clusters/x?tab=jobs"
        finally:
            context.close()
