"""The process backend isolates nothing, so tenants' commands are refused there by default.

A tenant's ``cluster exec``, ``job submit`` and portal terminal would run as the server's user on the
host and could read the data dir (``cat ../../../admin-token``). Without ``--insecure-host-commands``
each is a 403 with one line; with it they work (and the server warns). The portal terminal follows REST
exec's owner rule: an admin who can see a tenant's cluster cannot open a shell in it. The admin token is
never printed at start-up (only the path of DATA/admin-token).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator

import pytest

from elastrain.client import ClientError
from elastrain.server.exec_service import HOST_COMMANDS_REFUSED
from elastrain.testing.clusters import all_running
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(180)


def _start(plane: ControlPlane) -> ControlPlane:
    try:
        plane.start()
    except BaseException:
        plane.cleanup()
        raise
    return plane


@pytest.fixture(scope="module")
def strict(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A process-backend server started without --insecure-host-commands."""
    plane = _start(ControlPlane(tmp_path_factory.mktemp("strict"), extra_args=("--backend", "process")))
    try:
        yield plane
    finally:
        plane.cleanup()


@pytest.fixture(scope="module")
def insecure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A process-backend server started with --insecure-host-commands (the harness's default)."""
    plane = _start(ControlPlane(tmp_path_factory.mktemp("insecure")))
    try:
        yield plane
    finally:
        plane.cleanup()


def _tenant_cluster(plane: ControlPlane, user: str, cluster: str) -> str:
    """Create `user` and their 2-container `cluster` (Running); returns the user's token."""
    with plane.client() as admin:
        token = admin.create_user(user)
    with plane.client(token) as c:
        c.create_cluster(cluster, containers=2)
        c.wait_cluster(cluster, all_running)
    return token


def _exec(plane: ControlPlane, token: str, cluster: str, command: list[str]) -> tuple[str, int | None]:
    out, code = "", None
    with plane.client(token) as c:
        for item in c.exec(cluster, command):
            if isinstance(item, int):
                code = item
            else:
                out += item
    return out, code


def _terminal(plane: ControlPlane, token: str, cluster: str, typed: str = "") -> tuple[str, int | None]:
    """Open the portal terminal of `cluster` with `token`, type `typed`; the text received and the close
    code (1000: the shell exited)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = plane.url.replace("http://", "ws://") + f"/api/v1/clusters/{cluster}/terminal"
    out = ""
    with connect(url) as ws:
        ws.send(json.dumps({"token": token}))
        if typed:
            ws.send(json.dumps({"input": typed}))
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                out += str(ws.recv(timeout=15))
    received = closed.value.rcvd
    return out, received.code if received is not None else None


def _refused(call: Callable[[], object]) -> ClientError:
    with pytest.raises(ClientError) as refused:
        call()
    return refused.value


@pytest.mark.attack
def test_process_backend_refuses_tenant_commands(strict: ControlPlane) -> None:
    token = _tenant_cluster(strict, "mallory", "mal")
    walk = ["sh", "-c", "cat ../../../admin-token ../../admin-token ../admin-token"]
    with strict.client(token) as c:
        refused = _refused(lambda: list(c.exec("mal", walk)))
        assert refused.status == 403 and str(refused) == f"{HOST_COMMANDS_REFUSED} (HTTP 403)"
        refused = _refused(lambda: c.submit_job("mal", walk))
        assert refused.status == 403 and HOST_COMMANDS_REFUSED in str(refused)
        assert c.list_jobs() == []  # nothing was recorded, nothing ran
    out, code = _terminal(strict, token, "mal", "cat ../../../admin-token; exit\n")
    assert code == 4403 and HOST_COMMANDS_REFUSED in out
    assert strict.token not in out
    with strict.client() as admin:  # the refusal is the server's, not the tenant's: the admin too
        refused = _refused(lambda: list(admin.exec("mal", ["true"])))
        assert refused.status == 403 and HOST_COMMANDS_REFUSED in str(refused)
        actions = [e["action"] for e in admin.events("mal")]
        assert "cluster.exec" not in actions
        admin.delete_cluster("mal")
        admin.wait_deleted("mal")


@pytest.mark.attack
def test_admin_token_is_never_printed(strict: ControlPlane) -> None:
    log = (strict.root / "server.log").read_text()
    assert strict.token and strict.token not in log
    token_file = strict.data.resolve() / "admin-token"
    assert f"admin token in {token_file}" in log
    assert f"ELASTRAIN_TOKEN=$(cat {token_file})" in log
    assert "exec, jobs and terminals are refused on the process backend" in log


def test_insecure_flag_allows_commands_with_a_warning(insecure: ControlPlane) -> None:
    log = (insecure.root / "server.log").read_text()
    assert "WARNING: --insecure-host-commands" in log and insecure.token not in log
    token = _tenant_cluster(insecure, "trusted", "own")
    out, code = _exec(insecure, token, "own", ["sh", "-c", "echo exec-ok"])
    assert (out.strip(), code) == ("exec-ok", 0)
    with insecure.client(token) as c:
        job = c.submit_job("own", ["sh", "-c", "echo job-ok"])
        wait_until(lambda: c.get_job(job["id"])["status"] != "Running", 30, "the job to end")
        assert c.get_job(job["id"])["status"] == "Succeeded"
        assert "job-ok" in c.job_logs(job["id"])[0]
    out, code = _terminal(insecure, token, "own", "echo term-$((40 + 2)); exit\n")
    assert code == 1000 and "term-42" in out, out


@pytest.mark.attack
def test_admin_cannot_open_a_terminal_in_a_tenants_cluster(insecure: ControlPlane) -> None:
    """The terminal applies REST exec's owner rule: the admin sees the cluster but gets no shell in it."""
    token = _tenant_cluster(insecure, "tenant", "theirs")
    with insecure.client() as admin:
        assert admin.get_cluster("theirs").owner == "tenant"  # visible to the admin...
        refused = _refused(lambda: list(admin.exec("theirs", ["true"])))
        assert refused.status == 403 and "only the owner" in str(refused)  # ...REST exec refused...
    out, code = _terminal(insecure, insecure.token, "theirs", "echo admin-was-here; exit\n")
    assert code == 4403 and "only the owner of cluster 'theirs'" in out  # ...and so is the terminal
    assert "admin-was-here" not in out
    # an unknown token still gets 4401, another tenant 4404 (the cluster is invisible to them)
    assert _terminal(insecure, "not-a-token", "theirs")[1] == 4401
    with insecure.client() as admin:
        other = admin.create_user("other-tenant")
    assert _terminal(insecure, other, "theirs")[1] == 4404
    out, code = _terminal(insecure, token, "theirs", "echo mine; exit\n")  # the owner still gets one
    assert code == 1000 and "mine" in out
