"""Issue 29 item 3: on the container backend a tenant's processes run below the server's priority.

The README says tenants' processes run 10 nice levels below the server; on the container backend
they ran at the server's own (podman started them at its nice value, and they inherit it). ``podman
run`` and ``podman exec`` are now started `TENANT_NICE` levels down, so the container's init, every
process in it, an exec'd command and a job run there (a tenant cannot raise it back: no capability).
Skipped (with the reason) where podman cannot run containers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from elastrain.backends import podmanctl
from elastrain.backends.procs import TENANT_NICE
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import ContainerPlane, server_containers
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(600)
NICE_OF_SELF = "cut -d' ' -f19 /proc/self/stat"  # field 19 of stat: the nice value


def nice_of(pid: int) -> int:
    """The nice value of process `pid` (field 19 of its stat; the command may hold spaces)."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[16])


@pytest.mark.attack("29.priority")
def test_container_processes_run_below_the_server(ccp: ContainerPlane) -> None:
    assert ccp.proc is not None
    expected = min(19, nice_of(ccp.proc.pid) + TENANT_NICE)
    with ccp.client() as c:
        c.create_cluster("nice", framework="pytorch", containers=2)
        try:
            c.wait_cluster("nice", all_running, timeout=180)
            names = [n for n in server_containers(ccp.key) if "nice" in n]
            assert len(names) == 2, names
            for name in names:  # each container's init (and so what it starts: the node daemon, sshd)
                info = json.loads(podmanctl.podman("inspect", name, "--format", "json").stdout)[0]
                assert nice_of(int(info["State"]["Pid"])) == expected, name
            with ccp.http() as api:
                run = api.post("/clusters/nice/exec", json={"command": ["sh", "-c", NICE_OF_SELF]})
            assert run.status_code == 200, run.text
            assert json.loads(run.text.splitlines()[0])["out"].strip() == str(expected)
            job = c.submit_job("nice", ["sh", "-c", f"echo nice=$({NICE_OF_SELF})"])

            def job_nice() -> str | None:
                found = re.search(r"^nice=(\d+)", c.job_logs(job["id"])[0], re.M)
                return found.group(1) if found else None

            assert wait_until(job_nice, 60, "the job to print its nice value") == str(expected)
        finally:
            c.delete_cluster("nice")
            c.wait_deleted("nice", timeout=90)
