"""Issue 29 item 4: a container the backend refuses to start is retried with exponential backoff.

The report: ``--cpus 0.0001`` made ``podman run`` fail, and the server ran it again several times a
second, forever. (That value is now refused at create; see test_create_refusals.) Any refused start
now makes the cluster's next start wait twice as long as the last (2 s, 4 s, 8 s ... at most 5 min),
and the container's reason says why. Replayed with a refusal every backend makes: the mount source
of a running cluster is swapped for a symbolic link, then the cluster is scaled up.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from elastrain.testing.clusters import all_running
from tests.security.harness import start_server

pytestmark = pytest.mark.timeout(120)
WATCH_S = 12.0


@pytest.mark.attack("29.tiny-cpus")
def test_a_refused_start_backs_off_exponentially_and_says_why(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    with start_server(tmp_path / "server", ("--allow-mount", str(tmp_path))) as server, server.client() as c:
        c.create_cluster("loop", containers=2, mounts=[f"{data}:/data"])
        c.wait_cluster("loop", all_running)
        data.rename(tmp_path / "elsewhere")
        data.symlink_to(tmp_path / "elsewhere")
        c.scale_cluster("loop", 3)
        time.sleep(WATCH_S)  # the attack: let the server retry as often as it will
        with server.http() as api:
            events = api.get("/clusters/loop/events").json()
            cluster = api.get("/clusters/loop").json()
        failed = [e for e in events if e["action"] == "container.failed"]
        assert 1 <= len(failed) <= 4, [e["detail"] for e in failed]  # 2 s, 4 s, 8 s: at most 4 in 12 s
        reasons = [k["reason"] for k in cluster["containers"] if k["state"] != "Running"]
        assert reasons and "leads elsewhere" in reasons[0] and "start" in reasons[0], cluster
        c.delete_cluster("loop")
        c.wait_deleted("loop")
