"""Helpers shared by the security tests: a real `elastrain server` on the process backend (the
harness's `ControlPlane`), a new user, a one-line refusal, and a pickle payload that runs code when
unpickled.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx

from elastrain.testing.server import ControlPlane

Server = ControlPlane  # the security tests' name for a running server (proc, port, url, token, root)


@contextlib.contextmanager
def start_server(
    root: Path,
    extra_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    db_url: str | None = None,
) -> Iterator[Server]:
    """`elastrain server` on the process backend with its data under `root` (log: root/server.log),
    mounts allowed below `root`, no GPUs. Yields once it answers /healthz; on exit every cluster left
    is deleted, the server stopped (SIGTERM, then SIGKILL) and a leftover container init killed by
    PID. `env`: the server's environment (default: this one less ELASTRAIN_MAX_BODY_BYTES);
    `db_url`: its database (default: SQLite in its data dir)."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "ELASTRAIN_MAX_BODY_BYTES"}
    server = ControlPlane(
        root,
        db_url,
        gpus=0,
        extra_args=("--allow-mount", str(root), *extra_args),
        insecure_host_commands=False,
        mounts=False,
        drain_seconds=None,
        reconcile_interval=None,
        env=env,
    )
    try:
        server.start()
        yield server
    finally:
        server.stop()  # its clusters deleted (their processes stopped), the server stopped, by PID


def new_user(server: Server, name: str, **extra: object) -> str:
    """Create user `name` as the admin (`extra`: more fields of the request); returns their token."""
    with server.http() as admin:
        created = admin.post("/users", json={"name": name, **extra})
    assert created.status_code == 201, created.text
    return str(created.json()["token"])


def refused(response: httpx.Response, status: int, *words: str) -> str:
    """Assert `response` is a `status` refusal whose one-line message holds every word; returns it.
    The message is the body's `error` member, or `detail` (RFC 9457 problem details) without one."""
    assert response.status_code == status, response.text
    body = response.json()
    message = str(body["error"] if "error" in body else body["detail"])
    assert "\n" not in message and "Traceback" not in message
    for word in words:
        assert word in message, message
    return message


class Evil:
    """Unpickling this runs code: it creates `marker`."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (exec, (f"open({str(self.marker)!r}, 'w').write('pwned')",))
