"""Secrets never ride in a host command line: ``ps`` and ``/proc/PID/cmdline`` show argv to every user.

A job's ``podman exec`` lives as long as the job, and used to carry ``--env ELASTRAIN_REPORT_TOKEN=...``
(and a terminal's ``--env ELASTRAIN_ATTACH_TOKEN=...``); ``podman run`` carried the cluster's node
secret. Now a secret is named only (``--env KEY``) and its value is in the podman process's
environment, which podman reads for a name given without a value (podman 4.3). The unit tests check
every argv builder; the container test reads a running job's ``podman exec`` from /proc.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from elastrain.agent.services import LAB_TOKEN_ENV
from elastrain.backends import container as container_module
from elastrain.backends import podmanctl
from elastrain.backends.api import ContainerSpec
from elastrain.backends.container import ContainerBackend
from elastrain.backends.container_run import env_flags, is_secret_env, run_env, secret_env
from elastrain.testing.clusters import all_running
from elastrain.testing.containers import ContainerPlane, server_containers
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(300)
TOKENS = {
    "ELASTRAIN_REPORT_TOKEN": "report-t0ken-value",
    "ELASTRAIN_ATTACH_TOKEN": "attach-t0ken-value",
    "ELASTRAIN_JOB_TOKEN": "job-t0ken-value",
}
PLAIN = {"ELASTRAIN_JOB_ID": "7", "ELASTRAIN_EXEC_ID": "e1", "ELASTRAIN_REPORT_URL": "http://x"}


def _spec(env: dict[str, str] | None = None, role: str = "launcher") -> ContainerSpec:
    return ContainerSpec(
        cluster="c1",
        cluster_uid="u1",
        name="c1-launcher",
        role=role,
        address="c1-launcher",
        image="localhost/elastrain-pytorch:latest",
        tenant="alice",
        tenant_uid=20002,
        env=dict(env or {}),
    )


def _values(env: dict[str, str]) -> list[str]:
    return [value for key, value in env.items() if is_secret_env(key)]


@pytest.fixture
def backend(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ContainerBackend:
    monkeypatch.setattr(podmanctl, "podman_path", lambda: "/usr/bin/podman")  # argv only: nothing runs
    return ContainerBackend(tmp_path / "data")


@pytest.mark.attack
def test_the_argv_builders_never_hold_a_secret_value(backend: ContainerBackend) -> None:
    """`podman run`, `podman exec` (jobs, exec) and the terminal's command name secrets, never show them."""
    env = {**TOKENS, **PLAIN}
    run = backend._run_args(_spec(env), "n0de-secret-value")
    exec_argv = backend._exec_prefix(_spec(env), env, tty=False)
    terminal = backend.terminal_command(_spec(PLAIN), TOKENS) or []
    for argv in (run, exec_argv, terminal):
        text = "\0".join(argv)
        for value in [*TOKENS.values(), "n0de-secret-value"]:
            assert value not in text, (value, argv)
        flags = [argv[i + 1] for i, a in enumerate(argv) if a == "--env"]
        assert "ELASTRAIN_REPORT_TOKEN" in flags or "ELASTRAIN_ATTACH_TOKEN" in flags  # named, bare
        assert "ELASTRAIN_EXEC_ID=e1" in flags or "ELASTRAIN_EXEC_ID" not in " ".join(flags)  # plain: inline
    assert "ELASTRAIN_NODE_SECRET" in run
    assert secret_env(run_env(_spec(), "n0de-secret-value"))["ELASTRAIN_NODE_SECRET"] == "n0de-secret-value"
    assert env_flags({"A": "1", "X_TOKEN": "v"}) == ["--env", "A=1", "--env", "X_TOKEN"]
    assert not is_secret_env("ELASTRAIN_JOB_ID") and not is_secret_env("PATH") and not is_secret_env("HOME")


@pytest.mark.attack
def test_the_secret_values_go_to_podmans_environment(
    backend: ContainerBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The values the name-only flags need are in the environment of the podman process (exec and run),
    and nowhere in its argv."""
    started: list[dict[str, Any]] = []

    class Recorder:
        def __init__(self, argv: list[str], **kwargs: Any) -> None:
            started.append({"argv": argv, **kwargs})
            self.pid = 0

    monkeypatch.setattr(container_module.subprocess, "Popen", Recorder)
    backend.exec(_spec({**TOKENS, **PLAIN}), ["sleep", "1"])
    (call,) = started
    assert all(call["env"][key] == value for key, value in TOKENS.items())
    assert not any(value in " ".join(call["argv"]) for value in TOKENS.values())

    ran: list[dict[str, Any]] = []

    def fake_podman(*args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        ran.append({"args": args, **kwargs})
        return subprocess.CompletedProcess(list(args), 0, "", "")

    monkeypatch.setattr(container_module, "podman", fake_podman)
    monkeypatch.setattr(backend, "_inspect", lambda name: None)
    monkeypatch.setattr(backend, "_prepare_cluster", lambda spec: "n0de-secret-value")
    monkeypatch.setattr(backend, "_refresh_hosts", lambda cluster: None)
    monkeypatch.setattr(container_module, "cluster_lab_token", lambda base: "l4b-token-value")
    backend.create_container(_spec())
    (run,) = [r for r in ran if r["args"][:1] == ("run",)]
    assert run["env"] == {"ELASTRAIN_NODE_SECRET": "n0de-secret-value", LAB_TOKEN_ENV: "l4b-token-value"}
    assert "n0de-secret-value" not in " ".join(run["args"])
    assert "l4b-token-value" not in " ".join(run["args"])  # the launcher's JupyterLab token too

    seen: list[dict[str, Any]] = []
    monkeypatch.setattr(
        podmanctl.subprocess, "run", lambda argv, **kw: seen.append({"argv": argv, **kw}) or _done(argv)
    )
    podmanctl.podman("version", env={"X_TOKEN": "v"})
    assert seen[0]["env"]["X_TOKEN"] == "v" and "PATH" in seen[0]["env"]  # added to podman's own


def _done(argv: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.CompletedProcess(argv, 0, "", "")


def _podman_exec_of(job_id: int) -> int | None:
    """The pid of the host's ``podman exec`` running job `job_id` (tagged ``ELASTRAIN_JOB_ID=<id>``)."""
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if (
            argv
            and argv[0].endswith(b"podman")
            and b"exec" in argv
            and f"ELASTRAIN_JOB_ID={job_id}".encode() in argv
        ):
            return int(proc.name)
    return None


@pytest.mark.attack
def test_a_running_jobs_podman_exec_shows_no_token(ccp: ContainerPlane) -> None:
    """On the container backend: a running job's ``podman exec`` names ELASTRAIN_REPORT_TOKEN in its
    argv, holds its value only in its environment, and the job inside still gets the value; the
    containers got the node secret (podman read it from its environment)."""
    with ccp.client() as c:
        c.create_cluster("argv", framework="pytorch", containers=2)
        try:
            c.wait_cluster("argv", all_running, timeout=180)
            script = 'test -n "$ELASTRAIN_REPORT_TOKEN" && echo token-inside; sleep 60'
            job = c.submit_job("argv", ["sh", "-c", script])
            pid = wait_until(lambda: _podman_exec_of(job["id"]), 30, "the job's podman exec")
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
            environ = dict(
                item.split(b"=", 1)
                for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                if b"=" in item
            )
            token = environ[b"ELASTRAIN_REPORT_TOKEN"]
            assert len(token) >= 16 and b"ELASTRAIN_REPORT_TOKEN" in argv
            assert not any(token in arg for arg in argv)
            wait_until(lambda: "token-inside" in c.job_logs(job["id"])[0], 30, "the job to see its token")
            c.cancel_job(job["id"])
            secret = (ccp.data / "clusters" / "argv" / "secret").read_text().strip()
            names = [n for n in server_containers(ccp.key) if "argv" in n]
            assert names
            for name in names:
                info = json.loads(podmanctl.podman("inspect", name, "--format", "json").stdout)[0]
                assert f"ELASTRAIN_NODE_SECRET={secret}" in info["Config"]["Env"]
        finally:
            c.delete_cluster("argv")
            c.wait_deleted("argv", timeout=90)
