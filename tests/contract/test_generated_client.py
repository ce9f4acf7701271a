"""A client generated from ``docs/openapi.json`` by a standard generator drives a live server.

`openapi-python-client` (pinned in the dev extra) generates the package ``elastrain_api`` into a temp
dir at test time (never committed; settings: ``tests/contract/openapi-python-client.yaml``), with
``--fail-on-warning``: a schema the generator cannot read fully fails here. The flow then uses that
package and nothing else: create a cluster -> scale it -> read its hostfile -> submit a job and wait for
it to succeed -> delete the cluster and see it gone.

The generated modules are named after the operationIds (``createCluster`` -> ``create_cluster``).
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar

import httpx
import pytest

from elastrain.testing.server import ControlPlane
from tests.contract.conftest import PUBLISHED, REPO

pytestmark = pytest.mark.timeout(180)
CONFIG = Path(__file__).with_name("openapi-python-client.yaml")
PACKAGE = "elastrain_api"
T = TypeVar("T")


class Generated:
    """The generated package: `op("create_cluster")` is the module of operationId ``createCluster``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.package = importlib.import_module(PACKAGE)
        self.models = importlib.import_module(f"{PACKAGE}.models")

    def op(self, name: str) -> ModuleType:
        """The module of one operation, whatever tag (sub-package of ``api``) it is filed under."""
        found = sorted((self.root / PACKAGE / "api").glob(f"*/{name}.py"))
        assert len(found) == 1, f"the generated client has no single operation module {name}: {found}"
        return importlib.import_module(f"{PACKAGE}.api.{found[0].parent.name}.{name}")


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generated]:
    """Generate the client from the published schema and import it from the temp dir (removed after)."""
    root = tmp_path_factory.mktemp("generated-client")
    argv = [sys.executable, "-m", "openapi_python_client", "generate", "--path", str(PUBLISHED)]
    argv += ["--output-path", str(root / PACKAGE), "--meta", "none", "--config", str(CONFIG)]
    argv += ["--fail-on-warning"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=REPO, timeout=120, check=False)
    output = done.stdout[-4000:] + done.stderr[-4000:]
    assert done.returncode == 0, f"openapi-python-client failed:\n{output}"
    sys.path.insert(0, str(root))
    try:
        yield Generated(root)
    finally:
        sys.path.remove(str(root))
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[module]


def poll(what: str, probe: Callable[[], T | None], timeout: float = 30.0) -> T:
    """Call `probe` every 0.1 s until it returns something truthy; fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(0.1)


def ok(response: Any, status: int) -> Any:
    """The parsed body of a generated `Response`, after checking its status."""
    assert response.status_code == status, (response.status_code, response.content[:2000])
    return response.parsed


def test_live_server_serves_the_published_schema(control_plane: ControlPlane) -> None:
    import json

    served = httpx.get(control_plane.url + "/openapi.json", timeout=10).json()
    assert served == json.loads(PUBLISHED.read_text(encoding="utf-8")), "run `make openapi`"


def test_generated_client_runs_create_scale_hostfile_submit_delete(
    control_plane: ControlPlane, generated: Generated
) -> None:
    api, models = generated.package, generated.models
    client = api.AuthenticatedClient(base_url=control_plane.url, token=control_plane.token, timeout=30.0)
    name = "gc"
    with client:
        created = ok(
            generated.op("create_cluster").sync_detailed(
                client=client, body=models.ClusterCreate(name=name, containers=2)
            ),
            201,
        )
        assert isinstance(created, models.ClusterOut) and created.name == name

        def running(containers: int) -> Any:
            cluster = ok(generated.op("get_cluster").sync_detailed(name, client=client), 200)
            states = [str(c.state) for c in cluster.containers]
            return cluster if states == ["Running"] * containers else None

        poll("2 running containers", lambda: running(2))
        scaled = ok(
            generated.op("scale_cluster").sync_detailed(
                name, client=client, body=models.ClusterScale(containers=3)
            ),
            200,
        )
        assert scaled.desired_containers == 3

        addresses = sorted(c.address for c in poll("3 running containers", lambda: running(3)).containers)

        def hostfile() -> list[str] | None:
            text = ok(generated.op("get_hostfile").sync_detailed(name, client=client), 200)
            hosts = sorted(line.split()[0] for line in text.splitlines() if line and not line.startswith("#"))
            return hosts if hosts == addresses else None

        poll("a hostfile listing the 3 containers", hostfile)

        job = ok(
            generated.op("submit_job").sync_detailed(
                name, client=client, body=models.JobSubmit(command=["python", "-c", "print(1)"])
            ),
            201,
        )
        assert isinstance(job, models.JobOut) and job.command == ["python", "-c", "print(1)"]

        def finished() -> Any:
            current = ok(generated.op("get_job").sync_detailed(job.id, client=client), 200)
            return current if str(current.status) in ("Succeeded", "Failed", "Cancelled") else None

        done = poll("the job to finish", finished, timeout=60)
        logs = ok(generated.op("get_job_logs").sync_detailed(job.id, client=client), 200)
        assert (str(done.status), done.exit_code) == ("Succeeded", 0), logs
        assert logs.strip().splitlines()[-1] == "1", logs

        deleting = ok(generated.op("delete_cluster").sync_detailed(name, client=client), 202)
        assert deleting.name == name
        poll(
            "the cluster to be gone",
            lambda: generated.op("get_cluster").sync_detailed(name, client=client).status_code == 404,
        )
