"""The portal's server side without a browser: pages and static files, no CDN links, the job-metrics
route and the terminal WebSocket (token first, owner only, a real shell in the launcher's root)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from elastrain.testing.clusters import all_running
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(120)
PORTAL = Path(__file__).resolve().parents[2] / "elastrain" / "portal"


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    cp = ControlPlane(tmp_path_factory.mktemp("portal-api"))
    cp.start()
    try:
        yield cp
    finally:
        cp.cleanup()


def test_pages_and_static_files_are_served_without_cdn(plane: ControlPlane) -> None:
    with httpx.Client(base_url=plane.url) as http:
        assert http.get("/").status_code == 307
        pages = ("/signin", "/clusters", "/clusters/new", "/clusters/x", "/clusters/x/terminal", "/jobs/1")
        for path in pages:
            page = http.get(path)
            assert page.status_code == 200 and page.headers["content-type"].startswith("text/html"), path
            for ref in re.findall(r'(?:src|href)="([^"]+)"', page.text):
                assert ref.startswith("/") or ref.startswith("#"), f"{path} loads {ref} from elsewhere"
                if ref.startswith("/static/"):
                    assert http.get(ref).status_code == 200, ref
        assert "<script>alert" not in http.get("/clusters/%3Cscript%3Ealert(1)%3C%2Fscript%3E").text
    for asset in (PORTAL / "static").rglob("*.js"):
        if "vendor" not in asset.parts:
            assert not re.search(r"https?://", asset.read_text()), f"{asset} refers to another site"


def test_job_metrics_are_the_owners_only(plane: ControlPlane) -> None:
    with plane.client() as c:
        c.create_cluster("metrics", containers=2)
        c.wait_cluster("metrics", all_running)
        job = c.submit_job("metrics", ["sh", "-c", "echo 'epoch 1 done: world 1, step 3, loss 0.5'"])
        headers = {"Authorization": f"Bearer {plane.token}"}
        url = f"{plane.url}/api/v1/jobs/{job['id']}/metrics"

        def rows() -> list[dict[str, object]]:
            return list(httpx.get(url, headers=headers).json())

        wait_until(lambda: c.get_job(job["id"])["status"] != "Running", 20, "the job to end")
        got = wait_until(rows, 20, "a metrics row")
        assert got[0]["step"] == 3 and got[0]["world_size"] == 1 and got[0]["loss"] == 0.5
        assert httpx.get(url, params={"after": got[-1]["id"]}, headers=headers).json() == []
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, params={"after": 2**70}, headers=headers).status_code == 422
        huge = f"{plane.url}/api/v1/jobs/{2**70}/metrics"
        assert httpx.get(huge, headers=headers).status_code == 422
        bob = c.create_user("metrics-bob")
        assert httpx.get(url, headers={"Authorization": f"Bearer {bob}"}).status_code == 404
        c.delete_cluster("metrics")
        c.wait_deleted("metrics")


def test_terminal_websocket(plane: ControlPlane) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    ws_url = plane.url.replace("http://", "ws://") + "/api/v1/clusters/term/terminal"
    with plane.client() as c:
        c.create_cluster("term", containers=2)
        c.wait_cluster("term", all_running)
        carol = c.create_user("term-carol")
        for token, code in (("wrong", 4401), (carol, 4404)):
            with connect(ws_url) as ws:
                ws.send(json.dumps({"token": token}))
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        ws.recv(timeout=10)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == code
        with connect(ws_url) as ws:
            ws.send(json.dumps({"token": plane.token, "resize": [100, 30]}))
            ws.send(json.dumps({"input": "echo at=$(pwd) $ELASTRAIN_CONTAINER_ROLE $(tput cols); exit\n"}))
            out = ""
            with pytest.raises(ConnectionClosed):
                while True:
                    out += str(ws.recv(timeout=10))
        root = plane.data / "clusters" / "term" / "term-launcher"
        assert f"at={root} launcher 100" in out, out
        c.delete_cluster("term")
        c.wait_deleted("term")
