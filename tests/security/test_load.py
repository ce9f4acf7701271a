"""Load with a noisy neighbour: 50 tenants list, get and scale their own clusters for 60 s while one
tenant floods their portal terminal with input. A real `elastrain server` on the process backend.

Asserted: no 5xx, no request slower than 1 s, the server's RSS bounded (< 2x start + 200 MB). The
figures (requests, p50/p99/max latency, RSS start/peak/end, terminal bytes) are printed.
``ELASTRAIN_LOAD_SECONDS`` shortens (or lengthens) the 60 s.

The tenants behave like scripts polling an API: one request, then 0.5-1.5 s of think time (about 50
requests/s together, one in 13 a scale between 2 and 3 containers, which on the process backend starts
or stops one small init process). The terminal tenant sends lines as fast as the server takes them and
reads what the shell echoes, as a browser tab pasting a huge text would.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shutil
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from elastrain.backends.procs import cmdline, terminate
from tests.security.harness import Server, start_server

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(420)]
DURATION_S = float(os.environ.get("ELASTRAIN_LOAD_SECONDS", "60"))
TENANTS = 50
LATENCY_BOUND_S = 1.0
OPS = ("list", "get", "get", "list", "get", "get") * 2 + ("scale",)  # each cluster scales every ~13 s


@dataclass
class Stats:
    """Every request's latency and status, from all client threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    latencies: list[float] = field(default_factory=list)
    statuses: dict[int, int] = field(default_factory=dict)
    requests: list[tuple[float, str]] = field(default_factory=list)  # (seconds, what), to name the slowest
    errors: list[str] = field(default_factory=list)

    def record(self, op: str, status: int, seconds: float, request_id: str, at: float) -> None:
        with self.lock:
            self.latencies.append(seconds)
            self.statuses[status] = self.statuses.get(status, 0) + 1
            self.requests.append((seconds, f"{op} -> {status} at +{at:.1f}s (X-Request-ID {request_id})"))

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

    def slowest(self, n: int = 5, server_ms: dict[str, str] | None = None) -> list[str]:
        """The `n` slowest requests; with `server_ms` (request id -> the access log's ``ms``), each
        says how much of it the server itself took (the rest: the network, or the client's threads)."""
        worst = sorted(self.requests, reverse=True)[:n]
        lines = []
        for seconds, what in worst:
            rid = what.rsplit("X-Request-ID ", 1)[-1].rstrip(")")
            inside = f" (server {server_ms[rid]} ms)" if server_ms and rid in server_ms else ""
            lines.append(f"{seconds * 1000:.0f} ms {what}{inside}")
        return lines


def access_log_ms(log_text: str) -> dict[str, str]:
    """Request id -> ``ms`` from each access-log line of the server's log."""
    return dict(re.findall(r"elastrain access: .*? id=(\S+) .*? ms=([0-9.]+)", log_text))


def _processes_under(root: Path) -> list[int]:
    """Live processes started for this server (their argv or working directory is under `root`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except OSError:
            cwd = ""
        argv = cmdline(int(entry.name))
        if cwd.startswith(str(root)) or any(arg.startswith(str(root)) for arg in argv):
            found.append(int(entry.name))
    return found


@dataclass
class LoadServer:
    """The server and the tenants' tokens (user name -> token), filled by the test."""

    server: Server
    tokens: dict[str, str] = field(default_factory=dict)


@pytest.fixture(scope="module")
def load_server() -> Iterator[LoadServer]:
    """A server of its own (a fresh RSS baseline); its clusters and processes are gone afterwards."""
    root = Path(tempfile.mkdtemp(prefix="elastrain-load-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTRAIN_")}
    # default reconcile interval (0.5 s); the portal terminal is refused on the process backend without
    # --insecure-host-commands
    try:
        with start_server(root, ("--insecure-host-commands",), env=env) as server:
            loaded = LoadServer(server)
            try:
                yield loaded
            finally:
                if server.proc.poll() is None:
                    _delete_every_cluster(loaded)
    finally:
        terminate(_processes_under(root))
        shutil.rmtree(root, ignore_errors=True)


def _delete_every_cluster(loaded: LoadServer, timeout_s: float = 60) -> None:
    """Delete every tenant's clusters and wait (bounded) until they are gone."""
    deadline = time.monotonic() + timeout_s
    for token in loaded.tokens.values():
        with loaded.server.http(token=token) as api:
            for cluster in api.get("/clusters").json():
                api.delete(f"/clusters/{cluster['name']}")
    for token in loaded.tokens.values():
        with loaded.server.http(token=token) as api:
            while api.get("/clusters").json() and time.monotonic() < deadline:
                time.sleep(0.5)


def _running(api: httpx.Client, names: list[str], timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    for name in names:
        while (state := api.get(f"/clusters/{name}").json()["state"]) != "Running":
            assert time.monotonic() < deadline, f"{name} is {state} after {timeout_s:.0f} s"
            time.sleep(0.2)


def _setup_tenants(loaded: LoadServer) -> dict[str, str]:
    """One user with one 2-container cluster per tenant, plus the terminal spammer; all Running."""
    server, tokens = loaded.server, loaded.tokens
    with server.http() as admin:
        for user in [f"load-{i}" for i in range(TENANTS)] + ["load-spammer"]:
            created = admin.post("/users", json={"name": user})
            assert created.status_code == 201, created.text
            tokens[user] = created.json()["token"]
    for user, token in tokens.items():
        with server.http(token=token) as api:
            body = {"name": f"c-{user}", "containers": 2, "gpus_per_container": 0}
            created = api.post("/clusters", json=body)
            assert created.status_code == 201, created.text
    for user, token in tokens.items():
        with server.http(token=token) as api:
            _running(api, [f"c-{user}"])
    return tokens


def _tenant(
    server: Server, user: str, token: str, stop: threading.Event, stats: Stats, seed: int, t0: float
) -> None:
    rng = random.Random(seed)
    name, size = f"c-{user}", 2
    with server.http(token=token) as api:
        n = rng.randrange(len(OPS))
        stop.wait(rng.uniform(0, 1.5))  # the tenants do not start in lockstep
        while not stop.is_set():
            op = OPS[n % len(OPS)]
            started = time.perf_counter()
            try:
                if op == "list":
                    answer = api.get("/clusters")
                elif op == "get":
                    answer = api.get(f"/clusters/{name}")
                else:
                    size = 5 - size  # 2 <-> 3
                    answer = api.patch(f"/clusters/{name}", json={"containers": size})
            except httpx.HTTPError as exc:
                with stats.lock:
                    stats.errors.append(f"{user} {op}: {type(exc).__name__}: {exc}")
                stop.wait(0.5)
                continue
            rid = answer.headers.get("x-request-id", "-")
            stats.record(op, answer.status_code, time.perf_counter() - started, rid, started - t0)
            n += 1
            stop.wait(rng.uniform(0.5, 1.5))


@dataclass
class Flood:
    sent: int = 0
    received: int = 0
    error: str = ""
    socket: Any = None  # the client connection, closed by the test when the time is up


def _spam_terminal(server: Server, token: str, stop: threading.Event, flood: Flood) -> None:
    """Send input as fast as the server reads it (no compression: `sent` is what crossed the wire)."""
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    url = f"ws://127.0.0.1:{server.port}/api/v1/clusters/c-load-spammer/terminal"
    chunk = json.dumps({"input": (": " + "spam " * 40 + "\n") * 20})
    try:
        # no keepalive pings: while the shell is behind, the server stops reading this socket (that is the
        # backpressure under test), so a ping would go unanswered and the client itself would close on its
        # ping timeout under load. A browser's xterm sends no pings either.
        with connect(
            url, open_timeout=10, close_timeout=2, max_size=None, compression=None, ping_interval=None
        ) as ws:
            flood.socket = ws
            ws.send(json.dumps({"token": token, "resize": [120, 40]}))

            def read() -> None:
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        flood.received += len(ws.recv())

            threading.Thread(target=read, name="load-terminal-reader", daemon=True).start()
            while not stop.is_set():
                ws.send(chunk)  # blocks while the server does not read: the shell is behind
                flood.sent += len(chunk)
    except ConnectionClosed as exc:
        if not stop.is_set():
            flood.error = f"the terminal closed during the flood: {exc}"
    except Exception as exc:  # reported by the test, not lost in a thread
        flood.error = f"{type(exc).__name__}: {exc}"


def cpu_seconds(server: Server) -> float:
    """The server's user+system CPU time so far."""
    fields = Path(f"/proc/{server.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def monitor_rss(server: Server, stop: threading.Event, samples: list[int]) -> None:
    while not stop.wait(0.5):
        samples.append(server.rss_kib())


@pytest.mark.attack
def test_fifty_tenants_and_a_terminal_flood(load_server: LoadServer, security_figures: list[str]) -> None:
    server = load_server.server
    tokens = _setup_tenants(load_server)
    time.sleep(1.0)  # let the reconciler settle
    rss_start, cpu_start, t0 = server.rss_kib(), cpu_seconds(server), time.perf_counter()
    stop, stats, flood, samples = threading.Event(), Stats(), Flood(), [rss_start]
    threads = [
        threading.Thread(target=_tenant, args=(server, user, tokens[user], stop, stats, i, t0), daemon=True)
        for i, user in enumerate(u for u in tokens if u != "load-spammer")
    ]
    spammer = (server, tokens["load-spammer"], stop, flood)
    threads.append(threading.Thread(target=_spam_terminal, args=spammer, daemon=True))
    threads.append(threading.Thread(target=monitor_rss, args=(server, stop, samples), daemon=True))
    started = time.monotonic()
    try:
        for thread in threads:
            thread.start()
        time.sleep(DURATION_S)
    finally:
        stop.set()
        if flood.socket is not None:  # a send blocked by the server's backpressure fails now
            with contextlib.suppress(OSError):
                flood.socket.socket.shutdown(socket.SHUT_RDWR)
        for thread in threads:
            thread.join(timeout=30)
    elapsed = time.monotonic() - started
    rss_end, cpu = server.rss_kib(), cpu_seconds(server) - cpu_start
    log_text = (server.root / "server.log").read_text(errors="replace")
    requests = len(stats.latencies)
    p50, p99 = stats.percentile(0.5) * 1000, stats.percentile(0.99) * 1000
    figures = [
        f"load: {requests} requests from {TENANTS} tenants in {elapsed:.0f} s ({requests / elapsed:.0f}/s); "
        f"statuses {dict(sorted(stats.statuses.items()))}; latency p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
        f"max {max(stats.latencies, default=0) * 1000:.0f} ms",
        f"load: terminal flood sent {flood.sent / 1e6:.1f} MB, read back {flood.received / 1e6:.1f} MB; "
        f"server RSS start {rss_start / 1024:.0f} MiB, peak {max(samples) / 1024:.0f} MiB, "
        f"end {rss_end / 1024:.0f} MiB; server CPU {cpu:.0f} s ({cpu / elapsed:.0%} of a core); "
        f"access-log lines {log_text.count('elastrain access: ')}; load average {os.getloadavg()[0]:.1f}",
        "load: slowest: " + "; ".join(stats.slowest(3, access_log_ms(log_text))),
    ]
    print("\n" + "\n".join(figures))
    security_figures.extend(figures)  # printed under the security summary line, -s or not
    assert not any(t.is_alive() for t in threads), "a client did not stop"
    assert not flood.error, flood.error
    assert not stats.errors, stats.errors[:5]
    assert requests > TENANTS * DURATION_S / 2, "the tenants made too few requests"
    assert flood.sent > 256 * 1024, "the terminal flood did not get going"
    assert not [s for s in stats.statuses if s >= 500], stats.statuses
    assert set(stats.statuses) == {200}, stats.statuses
    assert max(stats.latencies) < LATENCY_BOUND_S, stats.slowest()
    assert max([*samples, rss_end]) < 2 * rss_start + 200 * 1024, (rss_start, max(samples), rss_end)
    assert not any(token in log_text for token in [server.token, *tokens.values()]), "a token was logged"
