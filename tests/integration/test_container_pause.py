"""`podman pause` of a worker container is a hang, not an exit: the container is reported Paused
(kept, same container, no failure, no replacement), and Running again after `podman unpause`.

Skips (with the reason) where podman cannot run containers (the `ccp` fixture).
"""

from __future__ import annotations

import json

import pytest

from elastrain.backends.podmanctl import podman
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import ContainerPlane
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(300)


def _state_of(ccp: ContainerPlane, name: str) -> tuple[str, str]:
    with ccp.client() as c:
        row = next(k for k in c.get_cluster("frozen").containers if k.name == name)
        return row.state, row.reason


def test_a_paused_worker_is_paused_not_exited_and_runs_again_when_unpaused(ccp: ContainerPlane) -> None:
    worker, container = "frozen-worker-0", f"elastrain-{ccp.key}-frozen-worker-0"
    with ccp.client() as c:
        c.create_cluster("frozen", framework="pytorch", containers=2)
        c.wait_cluster("frozen", all_running, timeout=90)
    before = json.loads(podman("inspect", container, "--format", "json").stdout)[0]["Id"]
    podman("pause", container)
    try:
        _, reason = wait_until(
            lambda: (s := _state_of(ccp, worker))[0] == "Paused" and s, 30, "the worker to be Paused"
        )
        assert reason.startswith("paused (frozen)") and "the container exited" not in reason, reason
    finally:
        podman("unpause", container, check=False)
    wait_until(lambda: _state_of(ccp, worker)[0] == "Running", 30, "the worker to be Running again")
    after = json.loads(podman("inspect", container, "--format", "json").stdout)[0]["Id"]
    assert after == before  # the same container: never removed nor replaced
    with ccp.client() as c:
        actions = [(e["action"], e.get("detail", {}).get("container")) for e in c.events("frozen")]
        assert ("container.paused", worker) in actions, actions
        assert not [a for a in actions if a[0] in ("container.failed", "container.removed")], actions
        c.delete_cluster("frozen")
        c.wait_deleted("frozen", timeout=60)
