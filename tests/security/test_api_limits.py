"""Request limits of a real `elastrain server` (process backend): bodies refused before they are read,
a body cap (413), and integers too large for the database answered 404/422 instead of 500.

The oversized requests go over raw sockets: the test sends the headers (and a first slice of the body),
reads the answer, and only then tries to send the rest, as an attacker streaming a huge body would.
"""

from __future__ import annotations

import select
import socket
import time
from collections.abc import Iterator

import pytest

from tests.security.harness import Server, start_server  # Server: still imported from here by other tests

pytestmark = pytest.mark.timeout(90)
HUGE = "99999999999999999999"  # > 2**63: SQLite cannot bind it
CAP = 1 << 20  # the server's default body cap


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("sec")  # under pytest's own base: nothing left in the temp dir
    # the audit and cancel attacks need jobs on this backend
    with start_server(root, ("--reconcile-interval", "0.2", "--insecure-host-commands")) as running:
        yield running


def _head(method: str, path: str, headers: dict[str, str]) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _status(sock: socket.socket, timeout: float = 5.0) -> tuple[int, bytes]:
    """The status code and the bytes of the answer read so far (headers at least)."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 "), data[:200]
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        (
            int(line.split(b":", 1)[1])
            for line in head.lower().split(b"\r\n")
            if line.startswith(b"content-length:")
        ),
        0,
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        if not chunk:
            break
        body += chunk
    return int(data.split(b" ", 2)[1]), head + b"\r\n\r\n" + body


def _readable(sock: socket.socket) -> bool:
    return bool(select.select([sock], [], [], 0)[0])


def _send_quietly(sock: socket.socket, payload: memoryview, total: int) -> int:
    """Try to send `total` bytes of `payload` slices; stop when the server closes. Returns bytes sent."""
    sent = 0
    sock.settimeout(2)
    try:
        while sent < total:
            sent += sock.send(payload[: min(len(payload), total - sent)])
    except OSError:
        pass
    return sent


@pytest.mark.attack
def test_unauthenticated_huge_body_is_refused_unread(server: Server) -> None:
    size = 31 * (1 << 20)
    block = memoryview(b"x" * (1 << 20))
    rss_before = server.rss_kib()
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        head = {"Content-Type": "application/json", "Content-Length": str(size)}
        t0 = time.monotonic()
        sock.sendall(_head("POST", "/api/v1/users", head) + bytes(block[: 64 * 1024]))
        status, answer = _status(sock)
        elapsed = time.monotonic() - t0
        assert status in (401, 413), answer
        assert b"connection: close" in answer.lower()
        assert elapsed < 1.0, f"refusal took {elapsed:.2f}s"
        _send_quietly(sock, block, size)  # the rest: the server must neither keep nor parse it
    time.sleep(0.3)
    grown_mib = (server.rss_kib() - rss_before) / 1024
    assert grown_mib < 20, f"server RSS grew by {grown_mib:.1f} MiB"


@pytest.mark.attack
@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/users",
        "/api/v1/clusters",
        "/api/v1/jobs/1/progress",
        "/api/v1/jobs/attach",
        "/api/v1/nowhere",
    ],
)
def test_unauthenticated_bodies_answer_401_before_the_body(server: Server, path: str) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        headers = {"Content-Length": "100", "X-Job-Token": "forged", "X-Attach-Token": "forged"}
        sock.sendall(_head("POST", path, headers))  # no body at all: the answer must not wait for it
        status, answer = _status(sock, timeout=2)
    assert status == 401, answer


@pytest.mark.attack
def test_chunked_unauthenticated_body_is_refused(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(_head("POST", "/api/v1/users", {"Transfer-Encoding": "chunked"}) + b'4\r\n{"a"\r\n')
        status, answer = _status(sock, timeout=2)
    assert status == 401, answer


@pytest.mark.attack
def test_authenticated_body_over_the_cap_answers_413(server: Server) -> None:
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        headers = {"Authorization": f"Bearer {server.token}", "Content-Length": str(2 * CAP)}
        sock.sendall(_head("POST", "/api/v1/users", headers))
        status, answer = _status(sock, timeout=2)
    assert status == 413, answer
    body = answer.split(b"\r\n\r\n", 1)[1]
    assert b"413" in body and b"too large" in body


@pytest.mark.attack
def test_authenticated_chunked_body_growing_past_the_cap_answers_413(server: Server) -> None:
    chunk = b"%x\r\n" % (64 * 1024) + b" " * (64 * 1024) + b"\r\n"
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        headers = {"Authorization": f"Bearer {server.token}", "Transfer-Encoding": "chunked"}
        sock.sendall(_head("POST", "/api/v1/users", headers) + b"1\r\n{\r\n")
        sent = 0
        while sent < 8 * CAP and not _readable(sock):
            sock.sendall(chunk)
            sent += len(chunk)
            if sent > CAP:
                time.sleep(0.01)  # let the server catch up and answer
        status, answer = _status(sock, timeout=5)
    assert status == 413, answer
    assert sent < 8 * CAP


@pytest.mark.attack
def test_huge_integers_answer_404_or_422(server: Server) -> None:
    with server.http() as api, server.http(token="") as anonymous:
        answers = {
            "get": api.get(f"/jobs/{HUGE}"),
            "delete": api.delete(f"/jobs/{HUGE}"),
            "logs": api.get(f"/jobs/{HUGE}/logs"),
            "logs offset": api.get("/jobs/1/logs", params={"offset": HUGE}),
            "logs negative offset": api.get("/jobs/1/logs", params={"offset": "-" + HUGE}),
            "checkpoints": api.get(f"/jobs/{HUGE}/checkpoints"),
            "events": api.get(f"/jobs/{HUGE}/events"),
            "metrics": api.get(f"/jobs/{HUGE}/metrics"),
            "metrics after": api.get("/jobs/1/metrics", params={"after": HUGE}),
            "metrics limit": api.get("/jobs/1/metrics", params={"limit": HUGE}),
            "progress (bearer)": api.post(f"/jobs/{HUGE}/progress", json={"step": 1}),
            "incidents (bearer)": api.post(f"/jobs/{HUGE}/incidents", json={}),
            "progress (job token)": anonymous.post(
                f"/jobs/{HUGE}/progress", json={"step": 1}, headers={"X-Job-Token": "x"}
            ),
            "progress (no body)": anonymous.post(f"/jobs/{HUGE}/progress", headers={"X-Job-Token": "x"}),
            "incidents (job token)": anonymous.post(
                f"/jobs/{HUGE}/incidents", json={}, headers={"X-Job-Token": "x"}
            ),
        }
    bad = {what: (r.status_code, r.text[:200]) for what, r in answers.items() if r.status_code >= 500}
    assert not bad, bad
    for what, r in answers.items():
        assert r.status_code in (401, 404, 422), (what, r.status_code, r.text[:200])
        assert r.headers["content-type"].startswith("application/"), what
    assert answers["get"].status_code in (404, 422)


def test_normal_requests_still_work(server: Server) -> None:
    with server.http() as api, server.http(token="") as anonymous:
        assert anonymous.get("/healthz").status_code == 200
        assert anonymous.get("/me").status_code == 401
        assert api.get("/me").json()["admin"] is True
        created = api.post("/users", json={"name": "sec-alice"})
        assert created.status_code == 201, created.text
        alice = created.json()["token"]
        with server.http(token=alice) as as_alice:
            assert as_alice.get("/me").json()["name"] == "sec-alice"
            assert as_alice.get("/jobs").json() == []
            assert as_alice.get("/jobs/1").status_code == 404
            # a body just under the cap is read and validated (422: not a cluster), not refused
            big = as_alice.post("/clusters", json={"name": "x" * (CAP - 100)})
            assert big.status_code == 422, big.text[:200]
        # unknown job with a forged report token, no body: the route's own 401/422, never 500
        forged = anonymous.post("/jobs/1/progress", json={"step": 1}, headers={"X-Job-Token": "forged"})
        assert forged.status_code == 401


@pytest.mark.attack
def test_body_authorizer_accepts_only_valid_credentials() -> None:
    """The pre-body check, in process: bearer lookup, the job's own report token, an attach token."""
    import contextlib
    import threading
    from types import SimpleNamespace
    from typing import Any

    from elastrain.db.repository import hash_token
    from elastrain.server.app import body_authorizer

    job = SimpleNamespace(report_token_hash=hash_token("job-secret"))
    session = SimpleNamespace(get=lambda _model, job_id: job if job_id == 7 else None)
    db = SimpleNamespace(session=lambda: contextlib.nullcontext(session))
    services: Any = SimpleNamespace(db=db, authenticate=lambda _s, t: object() if t == "good" else None)
    jobs: Any = SimpleNamespace(_attach_lock=threading.Lock(), _attach_tokens={hash_token("att"): (1, "c")})
    ok = body_authorizer(services, jobs)
    assert ok("/api/v1/users", {"authorization": "Bearer good"})
    assert not ok("/api/v1/users", {"authorization": "Bearer bad"})
    assert not ok("/api/v1/users", {"authorization": "Basic good"})
    assert ok("/api/v1/jobs/7/progress", {"x-job-token": "job-secret"})
    assert ok("/api/v1/jobs/7/incidents", {"x-job-token": "job-secret"})
    assert not ok("/api/v1/jobs/7/progress", {"x-job-token": "wrong"})
    assert not ok("/api/v1/jobs/8/progress", {"x-job-token": "job-secret"})
    assert not ok("/api/v1/jobs/7/logs", {"x-job-token": "job-secret"})
    assert not ok(f"/api/v1/jobs/{HUGE[:19]}/progress", {"x-job-token": "job-secret"})
    assert ok("/api/v1/jobs/attach", {"x-attach-token": "att"})
    assert not ok("/api/v1/jobs/attach", {"x-attach-token": "other"})
    assert not ok("/api/v1/users", {"x-attach-token": "att"})
