"""Nothing a tenant places where the server reads his files blocks a server thread (issue 29, item 1).

A real `elastrain server` on the process backend. Bob replaces his running job's log
(``/var/log/jobs/<id>.log`` in his launcher) with a FIFO, a 50 GB sparse file, a symbolic link loop, a
FIFO a writer trickles bytes into, and a link (of the log's directory) to alice's job logs. With each in
place, `/api/v1/healthz` and alice's scale answer within 1 s (while 45 of bob's log requests run), the
reconciler still carries out alice's scale, bob's log requests answer (an error, or 1 MiB at most)
and never show a file outside his container, and bob's cluster shows ``Degraded`` for a refused file,
then recovers once the log is a regular file again.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from elastrain.testing.processes import terminate
from elastrain.testing.waits import wait_until
from tests.security.harness import Server, new_user, start_server

pytestmark = pytest.mark.timeout(240)
BOUND_S = 1.0  # the bound on healthz and another tenant's scale
SECRET = "a file outside bob's container"
TRICKLE = (  # a writer that never closes the FIFO and writes a byte every half second
    "import os, sys, time\nfd = os.open(sys.argv[1], os.O_RDWR)\n"
    "while True:\n    os.write(fd, b'x')\n    time.sleep(0.5)\n"
)


class Tenants:
    """The server, bob's and alice's clients, bob's job's log path and alice's cluster's size."""

    def __init__(self, server: Server, bob: httpx.Client, alice: httpx.Client, job: int, log: Path) -> None:
        self.server, self.bob, self.alice, self.job, self.log = server, bob, alice, job, log
        self.alice_size = 2
        self.alice_cluster = "alice-files"


def running_cluster(api: httpx.Client, name: str, **extra: object) -> None:
    body = {"name": name, "containers": 2, "gpus_per_container": 0, **extra}
    created = api.post("/clusters", json=body)
    assert created.status_code == 201, created.text
    wait_until(lambda: api.get(f"/clusters/{name}").json()["state"] == "Running", 180, f"{name} Running")


def submit_job(api: httpx.Client, cluster: str, command: list[str]) -> int:
    job = api.post(f"/clusters/{cluster}/jobs", json={"command": command})
    assert job.status_code in (200, 201), job.text
    return int(job.json()["id"])


@pytest.fixture(scope="module")
def tenants() -> Iterator[Tenants]:
    root = Path(tempfile.mkdtemp(prefix="elastrain-sec-files-"))
    with start_server(root, ("--reconcile-interval", "0.2", "--insecure-host-commands")) as server:
        bob = server.http(new_user(server, "bob"))
        alice = server.http(new_user(server, "alice"))
        try:
            running_cluster(bob, "bob-files")
            running_cluster(alice, "alice-files")
            job = submit_job(bob, "bob-files", ["sleep", "600"])
            (log,) = root.rglob(f"bob-files/*/var/log/jobs/{job}.log")
            yield Tenants(server, bob, alice, job, log)
            for api, name in ((bob, "bob-files"), (alice, "alice-files")):
                api.delete(f"/clusters/{name}")
            wait_until(lambda: not server.http().get("/clusters").json(), 60, "clusters deleted")
        finally:
            bob.close()
            alice.close()
    shutil.rmtree(root, ignore_errors=True)


def _fifo(log: Path) -> Callable[[], None]:
    os.mkfifo(log)
    return lambda: None


def _sparse(log: Path) -> Callable[[], None]:
    with open(log, "wb") as f:
        f.truncate(50 * 10**9)
    return lambda: None


def _loop(log: Path) -> Callable[[], None]:
    os.symlink(log.name, log)
    return lambda: None


def _trickle(log: Path) -> Callable[[], None]:
    os.mkfifo(log)
    writer = subprocess.Popen([sys.executable, "-c", TRICKLE, str(log)])
    return lambda: terminate(writer)


def _link_dir(log: Path) -> Callable[[], None]:
    """The log's directory becomes a link to a directory elsewhere holding a file of the log's name."""
    jobs = log.parent
    kept, elsewhere = jobs.with_name("jobs.kept"), jobs.parents[4] / "elsewhere"
    elsewhere.mkdir(exist_ok=True)
    (elsewhere / log.name).write_text(SECRET + "\n")
    jobs.rename(kept)
    os.symlink(elsewhere, jobs)

    def undo() -> None:
        jobs.unlink()
        kept.rename(jobs)

    return undo


ABUSES = {"fifo": _fifo, "sparse": _sparse, "loop": _loop, "trickle": _trickle, "link-dir": _link_dir}
REFUSED = {"fifo", "loop", "trickle", "link-dir"}  # the sparse file is read (its last 1 MiB)


def _timed(call: Callable[[], httpx.Response]) -> tuple[httpx.Response, float]:
    start = time.monotonic()
    response = call()
    return response, time.monotonic() - start


def flood_beside_healthz_and_scale(tenants: Tenants, what: str, figures: list[str]) -> list[httpx.Response]:
    """45 of bob's log requests, and meanwhile healthz and alice's scale (2 <-> 3 containers) each
    answered within `BOUND_S`; the log requests' answers."""
    with ThreadPoolExecutor(45) as pool:
        flood = [pool.submit(tenants.bob.get, f"/jobs/{tenants.job}/logs") for _ in range(45)]
        health, health_s = _timed(lambda: tenants.server.http("").get("/healthz"))
        tenants.alice_size = 5 - tenants.alice_size
        body = {"containers": tenants.alice_size}
        scaled, scale_s = _timed(lambda: tenants.alice.patch(f"/clusters/{tenants.alice_cluster}", json=body))
        answers = [f.result(timeout=30) for f in flood]
    figures.append(
        f"tenant file {what}: healthz {health_s * 1000:.0f} ms, alice's scale {scale_s * 1000:.0f} ms "
        "beside 45 of bob's log requests"
    )
    assert health.status_code == 200 and health_s < BOUND_S, (health.text, health_s)
    assert scaled.status_code == 200 and scale_s < BOUND_S, (scaled.text, scale_s)
    return answers


def running_count(api: httpx.Client, name: str) -> int:
    return sum(k["state"] == "Running" for k in api.get(f"/clusters/{name}").json()["containers"])


def cluster_state(api: httpx.Client, name: str) -> str:
    return str(api.get(f"/clusters/{name}").json()["state"])


@pytest.mark.attack("29.fifo-log")
@pytest.mark.parametrize("abuse", list(ABUSES))
def test_tenant_file_never_blocks_the_server(
    tenants: Tenants, abuse: str, security_figures: list[str]
) -> None:
    log = tenants.log
    saved = log.with_suffix(".saved")
    log.rename(saved)
    undo = ABUSES[abuse](log)
    try:
        answers = flood_beside_healthz_and_scale(tenants, abuse, security_figures)
        for answer in answers:  # 503: the cluster's read slots were all taken (a flood is refused)
            assert SECRET not in answer.text
            assert answer.status_code in ((409, 503) if abuse in REFUSED else (200, 503)), answer.text
            assert len(answer.content) <= 1 << 20
        if abuse not in REFUSED:
            assert 200 in {answer.status_code for answer in answers}
            again = tenants.bob.get(f"/jobs/{tenants.job}/logs")
            assert again.status_code == 200 and len(again.content) == 1 << 20, again.text[:200]
        alice_scaled = lambda: running_count(tenants.alice, "alice-files") == tenants.alice_size  # noqa: E731
        wait_until(alice_scaled, 60, "alice's scale carried out")
        if abuse in REFUSED:
            wait_until(
                lambda: cluster_state(tenants.bob, "bob-files") == "Degraded", 30, "bob's cluster Degraded"
            )
            reason = tenants.bob.get("/clusters/bob-files").json()["reason"]
            assert f"job {tenants.job}" in reason, reason
    finally:
        undo()
        if log.exists() or log.is_symlink():
            log.unlink()
        saved.rename(log)
    wait_until(lambda: cluster_state(tenants.bob, "bob-files") == "Running", 30, "bob's cluster recovered")
    again = tenants.bob.get(f"/jobs/{tenants.job}/logs")
    assert again.status_code == 200 and again.text.startswith("$ sleep 600"), again.text


def _rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


@pytest.mark.attack("29.log-bomb")
def test_a_container_log_bomb_is_read_as_its_tail(tenants: Tenants, security_figures: list[str]) -> None:
    """Bob's launcher's init log becomes 50 GB (sparse, a last line at its end), then a FIFO:
    ``GET /clusters/{name}/logs`` answers the lines of the last 1 MiB with little server memory, then
    a refusal; never a hang."""
    (init_log,) = tenants.log.parents[2].glob("log/container.log")
    saved = init_log.with_suffix(".saved")
    init_log.rename(saved)
    try:
        with open(init_log, "wb") as f:
            f.seek(50 * 10**9)
            f.write(b"\nthe last line\n")
        before = _rss_mib(tenants.server.proc.pid)
        for _ in range(3):
            answer = tenants.bob.get("/clusters/bob-files/logs")
            assert answer.status_code == 200 and answer.text.endswith("the last line\n")
            assert len(answer.content) <= 1 << 20
        grown = _rss_mib(tenants.server.proc.pid) - before
        security_figures.append(
            f"container log bomb (50 GB sparse): server RSS +{grown:.0f} MiB over 3 requests"
        )
        assert grown < 100, grown
        init_log.unlink()
        os.mkfifo(init_log)
        refused = tenants.bob.get("/clusters/bob-files/logs")
        assert refused.status_code == 409 and "FIFO" in refused.json()["detail"], refused.text
    finally:
        init_log.unlink(missing_ok=True)
        saved.rename(init_log)
