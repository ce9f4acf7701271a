"""The container backend's variant of test_tenant_files: bob, in his launcher container, replaces his
running job's log with a FIFO (``mkfifo /var/log/jobs/<id>.log``, the attack of issue 29 item 1, run
through `exec` as he ran it). Healthz and alice's scale answer within 1 s beside 45 of bob's log
requests, bob's log requests are refused, his cluster is shown Degraded, and recovers once the log is a
regular file again. Skips where podman cannot run containers.
"""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from elastrain.testing.containers import container_plane, framework_image, need_podman
from elastrain.testing.waits import wait_until
from tests.security.harness import new_user
from tests.security.test_tenant_files import (
    Tenants,
    cluster_state,
    flood_beside_healthz_and_scale,
    running_cluster,
    running_count,
    submit_job,
)

pytestmark = pytest.mark.timeout(900)


def _in_launcher(plane_client: httpx.Client, cluster: str, script: str) -> None:
    """Run `script` with sh in the cluster's launcher as its tenant; it must succeed."""
    answer = plane_client.post(
        f"/clusters/{cluster}/exec", json={"command": ["sh", "-c", script]}, timeout=60
    )
    assert answer.status_code == 200, answer.text
    assert '"exit": 0' in answer.text or '"exit":0' in answer.text, answer.text


@pytest.mark.attack("29.fifo-log")
def test_a_fifo_job_log_in_a_container(tmp_path: Path, security_figures: list[str]) -> None:
    need_podman()
    image = framework_image("pytorch")
    with container_plane(tmp_path) as plane:
        bob = plane.http(new_user(plane, "bob"))
        alice = plane.http(new_user(plane, "alice"))
        try:
            for api, name in ((bob, "bob-fifo"), (alice, "alice-fifo")):
                running_cluster(api, name, framework="pytorch", image=image)
            job = submit_job(bob, "bob-fifo", ["sleep", "600"])
            tenants = Tenants(plane, bob, alice, job, Path(f"/var/log/jobs/{job}.log"))
            tenants.alice_cluster = "alice-fifo"
            _in_launcher(bob, "bob-fifo", f"rm {tenants.log} && mkfifo {tenants.log}")
            answers = flood_beside_healthz_and_scale(tenants, "fifo (container)", security_figures)
            assert all(answer.status_code in (409, 503) for answer in answers), answers[0].text
            wait_until(lambda: running_count(alice, "alice-fifo") == tenants.alice_size, 120, "alice's scale")
            wait_until(lambda: cluster_state(bob, "bob-fifo") == "Degraded", 30, "bob's cluster Degraded")
            _in_launcher(bob, "bob-fifo", f"rm {tenants.log} && echo back > {tenants.log}")
            wait_until(lambda: cluster_state(bob, "bob-fifo") == "Running", 30, "bob's cluster recovered")
            assert bob.get(f"/jobs/{job}/logs").text == "back\n"
        finally:
            for api, name in ((bob, "bob-fifo"), (alice, "alice-fifo")):
                api.delete(f"/clusters/{name}")
            wait_until(lambda: not plane.http().get("/clusters").json(), 120, "clusters deleted")
            bob.close()
            alice.close()
