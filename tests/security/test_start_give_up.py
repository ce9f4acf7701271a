"""Issue 29 item 4: a container the backend keeps refusing to start ends in a state that says why.

The report: with ``--cpus 0.0001`` ``podman run`` failed and the server ran it again several times a
second, forever. Starts now back off (test_start_backoff) and, after ``--start-attempts`` refusals in a
row (default 8, about 4 minutes), the server stops trying: the cluster shows ``Degraded`` with the
reason (the last refusal and what to do), a ``cluster.degraded`` event says it, and no start runs any
more until the owner scales the cluster. Replayed with a refusal every backend makes: a storage area
of a running cluster replaced by a link, then a scale (run here with ``--start-attempts 2``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from elastrain.testing.waits import wait_until
from tests.security.harness import new_user, start_server
from tests.security.test_tenant_files import running_cluster

pytestmark = pytest.mark.timeout(180)
WATCH_S = 10.0  # past the give-up: 2 s, then no more tries


def _running(cluster: dict[str, Any]) -> int:
    return sum(1 for k in cluster["containers"] if k["state"] == "Running")


@pytest.mark.attack
def test_refused_starts_end_in_degraded_saying_why(tmp_path: Path) -> None:
    with start_server(tmp_path, ("--reconcile-interval", "0.2", "--start-attempts", "2")) as server:
        bob = server.http(new_user(server, "bob"))
        assert bob.post("/storage", json={"name": "ckpt"}).status_code == 201
        running_cluster(bob, "loop", mounts=["storage:ckpt:/data"])
        (area,) = server.data.glob("storage/u*/ckpt")
        moved = area.with_name("ckpt.moved")
        area.rename(moved)
        area.symlink_to(moved)
        assert bob.patch("/clusters/loop", json={"containers": 3}).status_code == 200
        wait_until(lambda: bob.get("/clusters/loop").json()["state"] == "Degraded", 60, "loop Degraded")
        cluster = bob.get("/clusters/loop").json()
        assert "gave up starting containers after 2 refused starts" in cluster["reason"], cluster
        assert "leads elsewhere" in cluster["reason"] and "scale the cluster" in cluster["reason"]
        time.sleep(WATCH_S)  # the attack goes on: nothing is tried any more
        events = bob.get("/clusters/loop/events").json()
        failed = [e for e in events if e["action"] == "container.failed"]
        assert len(failed) == 2, [e["detail"] for e in failed]
        assert any(e["action"] == "cluster.degraded" and "gave up" in e["text"] for e in events), events
        area.unlink()
        moved.rename(area)
        assert bob.patch("/clusters/loop", json={"containers": 3}).status_code == 200  # try again
        wait_until(lambda: _running(bob.get("/clusters/loop").json()) == 3, 60, "3 containers Running")
        assert bob.get("/clusters/loop").json()["state"] == "Running"
        bob.delete("/clusters/loop")
        wait_until(lambda: bob.get("/clusters/loop").status_code == 404, 60, "deleted")
