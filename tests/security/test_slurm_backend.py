"""The Slurm backend runs a tenant's commands on the server's machine, so they are refused by default.

On the Slurm backend a container is a Slurm job, but ``exec``, jobs and the portal terminal run through
the process backend's code: on the server's own machine, as its user, in ``<data>/clusters/C/N``, where
``cat ../../../admin-token`` would print the admin token. Without ``--insecure-host-commands`` each is a
403 with one line saying how to allow them. The app here is the real one (`create_app` on real
services, built as `elastrain.server.main.serve` builds them) over a `SlurmBackend` whose Slurm commands
are scripted: no Slurm is needed, and none is called.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from starlette.websockets import WebSocketDisconnect

from elastrain.backends.slurm import SlurmBackend
from elastrain.backends.slurmctl import SlurmCommands, SlurmJob, SlurmNode
from elastrain.cli.main import build_parser
from elastrain.server.exec_service import host_commands_refusal
from elastrain.server.settings import load_settings

pytestmark = pytest.mark.timeout(60)
WALK = ["sh", "-c", "cat ../../../admin-token ../../admin-token ../admin-token"]


class ScriptedSlurm(SlurmCommands):
    """Slurm with no jobs and no nodes; records every call (a submission would be a failure here)."""

    def __init__(self) -> None:
        super().__init__(env={})
        self.calls: list[str] = []

    def run(self, *args: str, stdin: str | None = None, env: Mapping[str, str] | None = None) -> str:
        self.calls.append(" ".join(args))
        raise AssertionError(f"no Slurm command may run here: {args}")

    def submit(self, sbatch_args: list[str], script: str, env: Mapping[str, str]) -> int:
        self.calls.append("sbatch")
        return 1

    def jobs(self) -> list[SlurmJob]:
        return []

    def nodes(self) -> dict[str, SlurmNode]:
        return {}

    def cancel(self, job_ids: Iterable[int], signal: str | None = None) -> None:
        self.calls.append("scancel")

    def total_gpus(self) -> int:
        return 0


@dataclass
class SlurmApp:
    client: TestClient
    admin: str  # the admin's token
    data: Path
    slurm: ScriptedSlurm

    def headers(self, token: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {token}"}


def _slurm_app(root: Path, *flags: str) -> Iterator[SlurmApp]:
    """The server's app on the Slurm backend, wired as `serve` wires it, with `flags` given."""
    from elastrain.db.session import Database
    from elastrain.server.app import create_app
    from elastrain.server.inventory import Inventory
    from elastrain.server.jobs import JobService
    from elastrain.server.main import bootstrap_admin, exec_service_for
    from elastrain.server.membership import JobMembership
    from elastrain.server.reconciler import Reconciler
    from elastrain.server.services import Services

    data = root / "data"
    data.mkdir(parents=True)
    settings = load_settings(build_parser().parse_args(["server", "--backend", "slurm", *flags]), environ={})
    db = Database(f"sqlite:///{data / 'elastrain.db'}")
    db.migrate()
    token = bootstrap_admin(db, data)
    assert token and (data / "admin-token").exists()
    slurm = ScriptedSlurm()
    backend = SlurmBackend(data, commands=slurm)
    inventory = Inventory.create(0, str(data))
    commands = exec_service_for(settings, backend, inventory)
    membership = JobMembership()
    reconciler = Reconciler(db, backend, inventory, membership=membership)
    services = Services(
        db, backend, inventory, reconciler, allowed_mount_roots=[root], data_dir=data, exec_service=commands
    )
    jobs = JobService(
        db, backend, inventory, report_url="http://127.0.0.1:9", membership=membership, exec_service=commands
    )
    with TestClient(create_app(services, jobs), raise_server_exceptions=False) as client:
        yield SlurmApp(client, token, data, slurm)


@pytest.fixture
def strict(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[SlurmApp]:
    """``elastrain server --backend slurm`` (no --insecure-host-commands anywhere)."""
    for name in ("ELASTRAIN_INSECURE_HOST_COMMANDS", "ELASTRAIN_INSECURE_PROCESS_BACKEND"):
        monkeypatch.delenv(name, raising=False)
    yield from _slurm_app(tmp_path)


def _tenant_with_cluster(app: SlurmApp, user: str, cluster: str) -> str:
    """Create `user` (as the admin) and their cluster `cluster`; the user's token."""
    created = app.client.post("/api/v1/users", json={"name": user}, headers=app.headers(app.admin))
    assert created.status_code == 201, created.text
    token = str(created.json()["token"])
    made = app.client.post(
        "/api/v1/clusters", json={"name": cluster, "containers": 2}, headers=app.headers(token)
    )
    assert made.status_code in (201, 202), made.text
    return token


def _one_line_refusal(response: object, status: int = 403) -> str:
    from httpx import Response

    assert isinstance(response, Response)
    assert response.status_code == status, response.text
    body = response.json()
    message = str(body["error"] if "error" in body else body["detail"])
    assert "\n" not in message
    return message


@pytest.mark.attack
def test_slurm_backend_refuses_tenant_commands(strict: SlurmApp) -> None:
    """Exec, job submission and the portal terminal are 403 on the Slurm backend without the flag."""
    token = _tenant_with_cluster(strict, "mallory", "mal")
    expected = host_commands_refusal("slurm")
    assert "--insecure-host-commands" in expected and "Slurm" in expected
    client, auth = strict.client, strict.headers(token)
    refused = client.post("/api/v1/clusters/mal/exec", json={"command": WALK}, headers=auth)
    assert _one_line_refusal(refused) == expected
    submitted = client.post("/api/v1/clusters/mal/jobs", json={"command": WALK}, headers=auth)
    assert _one_line_refusal(submitted) == expected
    listed = client.get("/api/v1/jobs", headers=auth)
    assert listed.status_code == 200 and listed.json() == []  # nothing recorded, nothing ran
    with client.websocket_connect("/api/v1/clusters/mal/terminal") as ws:
        ws.send_text(json.dumps({"token": token}))
        ws.send_text(json.dumps({"input": "cat ../../../admin-token; exit\n"}))
        received = ""
        with pytest.raises(WebSocketDisconnect) as closed:
            while True:
                received += ws.receive_text()
    assert closed.value.code == 4403 and expected in received
    admin_token = (strict.data / "admin-token").read_text().strip()
    assert admin_token not in refused.text + submitted.text + received
    # the refusal is the server's, not the tenant's: the admin's own command is refused the same way
    admin = client.post(
        "/api/v1/clusters/mal/exec", json={"command": ["true"]}, headers=strict.headers(strict.admin)
    )
    assert _one_line_refusal(admin) == expected


def test_the_flag_lets_trusted_users_run_commands(tmp_path: Path) -> None:
    """With --insecure-host-commands (or its old name) the policy lets the request through: the refusal
    is gone (here no container was started, so the request gets the next rule's answer: 409)."""
    for flag in ("--insecure-host-commands", "--insecure-process-backend"):
        for app in _slurm_app(tmp_path / flag.strip("-"), flag):
            token = _tenant_with_cluster(app, "trusted", "own")
            answer = app.client.post(
                "/api/v1/clusters/own/exec", json={"command": ["true"]}, headers=app.headers(token)
            )
            assert answer.status_code == 409 and "no launcher container yet" in answer.text, answer.text
