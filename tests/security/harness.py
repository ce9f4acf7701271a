"""Helpers shared by the security tests: a real `elastrain server` on the process backend, a new user,
a one-line refusal, and a pickle payload that runs code when unpickled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from elastrain.chaos.control_plane import free_port

REPO = Path(__file__).resolve().parents[2]


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    port: int
    url: str
    token: str
    root: Path

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def http(self, token: str | None = None) -> httpx.Client:
        auth = self.token if token is None else token
        headers = {"Authorization": f"Bearer {auth}"} if auth else {}
        return httpx.Client(base_url=self.url + "/api/v1", headers=headers, timeout=10)


@contextlib.contextmanager
def start_server(
    root: Path, extra_args: Sequence[str] = (), env: Mapping[str, str] | None = None
) -> Iterator[Server]:
    """`elastrain server` on the process backend with its data under `root` (log: root/server.log),
    mounts allowed below `root`, no GPUs. Yields once it answers /healthz; stopped (SIGTERM, then
    SIGKILL) on exit. `env`: the server's environment (default: this one less ELASTRAIN_MAX_BODY_BYTES)."""
    port = free_port()
    argv = [sys.executable, "-m", "elastrain", "server", "--port", str(port)]
    argv += ["--data-dir", str(root / "data")]
    argv += ["--gpus", "0", "--backend", "process", "--allow-mount", str(root), *extra_args]
    if env is None:
        env = {k: v for k, v in os.environ.items() if k != "ELASTRAIN_MAX_BODY_BYTES"}
    with open(root / "server.log", "ab") as log:
        proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO, env=dict(env))
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()[-3000:]
            try:
                if httpx.get(url + "/api/v1/healthz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not answer within 60 s"
            time.sleep(0.1)
        token = (root / "data" / "admin-token").read_text().strip()
        yield Server(proc, port, url, token, root)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
