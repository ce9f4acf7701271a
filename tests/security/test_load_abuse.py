"""Load with one abusive tenant (issue 29 item 5): 20 well-behaved clients work while one tenant runs
every abuse of the report at once, on a real `elastrain server` on the container backend.

The abuser, in and around his own cluster: his running job's log becomes a FIFO and he keeps asking for
it (``29.fifo-log``); his launcher opens as many connections to the API socket as it can and holds
them (``29.relay-flood``); it writes 200 MiB to its own container log and he keeps reading the logs
(``29.log-bomb``); he keeps 20 exec streams open (``29.exec-flood``); his launcher's lab port answers
every WebSocket with one 200 MB message, which he keeps opening through the portal
(``29.lab-message``). Meanwhile 20 clients of 4 other tenants (5 each) list, get and scale their own clusters.

Asserted: the well-behaved clients' p99 <= 1 s, none of their requests failed or answered other than
2xx, the server's RSS grew < 200 MB and its descriptors by a few hundred at most; the abuser got only
the refusals expected (his FIFO log 409, or 503/504 when his read slots are full or a read runs past
its deadline; the bomb never crosses: the socket closes, or nothing arrives in `LAB_WAIT_S`; 429
beyond the exec cap). The figures are printed under the security line. Run alone (`serial`):
``ELASTRAIN_LOAD_ABUSE_SECONDS`` changes the 25 s of abuse.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import shlex
import threading
import time
from collections.abc import Callable, Container, Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from elastrain.agent.services import LAB_PORT
from elastrain.testing.containers import ContainerPlane, container_plane
from elastrain.testing.waits import wait_until
from tests.security.abuser import FD_FLOOD, WS_BOMB, detached, log_bomb
from tests.security.harness import new_user
from tests.security.test_load import Stats, access_log_ms, cpu_seconds, monitor_rss

pytestmark = [pytest.mark.serial, pytest.mark.timeout(420)]
DURATION_S = float(os.environ.get("ELASTRAIN_LOAD_ABUSE_SECONDS", "25"))
TENANTS, CLIENTS_EACH = 4, 5  # 20 well-behaved clients
P99_BOUND_S, RSS_BOUND_KIB = 1.0, 200 * 1000 * 1000 // 1024
EXEC_STREAMS = 20  # the abuser's; the server's default cap is 8
BOMB_BYTES, LOG_BOMB_MIB = 200 * 10**6, 200
ABUSER = "abuser"
LAB_WAIT_S = 10.0  # how long the abuser waits for the bomb to arrive through the proxy
CLOSED = {f"closed {code}" for code in (1000, 1006, 1009, 1011)}  # the bomb never reached the browser


@dataclass
class Abuse:
    """What the abuser's threads saw: statuses by abuse, and anything unexpected."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    seen: dict[str, dict[str, int]] = field(default_factory=dict)
    unexpected: list[str] = field(default_factory=list)

    def record(self, what: str, outcome: object, expected: Container[object]) -> None:
        with self.lock:
            counts = self.seen.setdefault(what, {})
            counts[str(outcome)] = counts.get(str(outcome), 0) + 1
            if outcome not in expected and len(self.unexpected) < 20:
                self.unexpected.append(f"{what}: {outcome}")


@pytest.fixture(scope="module")
def plane(image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ContainerPlane]:
    """A server of its own on the container backend (a fresh RSS baseline); no container left after."""
    with container_plane(tmp_path_factory.mktemp("load-abuse")) as started:
        yield started


def _exec_free(api: httpx.Client, cluster: str, command: list[str]) -> str | None:
    """`command` run in the cluster's launcher by its tenant (it must succeed): its output lines;
    None while the tenant's exec slots are all taken (429)."""
    done = api.post(f"/clusters/{cluster}/exec", json={"command": command}, timeout=120)
    if done.status_code == 429:
        return None
    assert done.status_code == 200 and '"exit": 0' in done.text, done.text
    return done.text


def _output(ndjson: str) -> str:
    """The ``out`` text of an exec answer (one JSON object a line)."""
    return "".join(str(json.loads(line).get("out", "")) for line in ndjson.splitlines() if line.strip())


def _exec(api: httpx.Client, cluster: str, command: list[str]) -> str:
    """`_exec_free` where a slot must be free."""
    out = _exec_free(api, cluster, command)
    assert out is not None, f"no exec slot for {command[:2]}"
    return out


def _setup(plane: ContainerPlane, image: str) -> tuple[dict[str, str], int]:
    """The tenants' tokens (user -> token), each with one Running 2-container cluster ``c-<user>``;
    the abuser's running job's id."""
    tokens = {user: new_user(plane, user) for user in [f"well-{i}" for i in range(TENANTS)] + [ABUSER]}
    for user, token in tokens.items():
        with plane.http(token) as api:
            body = {"name": f"c-{user}", "containers": 2, "framework": "pytorch", "image": image}
            assert (created := api.post("/clusters", json=body)).status_code == 201, created.text
    for user, token in tokens.items():
        with plane.http(token) as api:
            running = lambda: api.get(f"/clusters/c-{user}").json()["state"] == "Running"  # noqa: B023,E731
            wait_until(running, 180, f"c-{user} Running")
    with plane.http(tokens[ABUSER]) as api:
        job = api.post(f"/clusters/c-{ABUSER}/jobs", json={"command": ["sleep", "600"]})
        assert job.status_code in (200, 201), job.text
    return tokens, int(job.json()["id"])


def _well_behaved(
    plane: ContainerPlane, user: str, token: str, scales: bool, stop: threading.Event, stats: Stats, t0: float
) -> None:
    """List, get and (one client per tenant) scale the tenant's own cluster, 0.5-1.5 s apart."""
    rng = random.Random(user + str(scales))
    ops = ("list", "get", "events", "get") * 3 + (("scale",) if scales else ("list",))
    name, size, n = f"c-{user}", 2, rng.randrange(13)
    with plane.http(token) as api:
        stop.wait(rng.uniform(0, 1.5))
        while not stop.is_set():
            op, started = ops[n % len(ops)], time.perf_counter()
            try:
                if op == "list":
                    answer = api.get("/clusters")
                elif op == "get":
                    answer = api.get(f"/clusters/{name}")
                elif op == "events":
                    answer = api.get(f"/clusters/{name}/events")
                else:
                    size = 5 - size  # 2 <-> 3
                    answer = api.patch(f"/clusters/{name}", json={"containers": size})
            except httpx.HTTPError as exc:
                with stats.lock:
                    stats.errors.append(f"{user} {op}: {type(exc).__name__}: {exc}")
                stop.wait(0.5)
                continue
            stats.record(
                op,
                answer.status_code,
                time.perf_counter() - started,
                answer.headers.get("x-request-id", "-"),
                started - t0,
            )
            n += 1
            stop.wait(rng.uniform(0.5, 1.5))


def _fds(plane: ContainerPlane) -> int:
    """How many descriptors the server holds open."""
    assert plane.proc is not None
    return len(os.listdir(f"/proc/{plane.proc.pid}/fd"))


def _monitor_fds(plane: ContainerPlane, stop: threading.Event, samples: list[int]) -> None:
    while not stop.wait(0.5):
        samples.append(_fds(plane))


def _loop(stop: threading.Event, pause_s: float, step: Callable[[], None]) -> None:
    """`step` again and again, `pause_s` apart, until `stop`."""
    while not stop.is_set():
        step()
        stop.wait(pause_s)


def _lab_bomb(plane: ContainerPlane, token: str, abuse: Abuse) -> Callable[[], None]:
    """One opening of the lab's WebSocket through the portal; each brings a 200 MB message."""
    from websockets.exceptions import ConnectionClosed, InvalidStatus
    from websockets.sync.client import connect
    from websockets.typing import Origin

    url = f"ws://127.0.0.1:{plane.port}/clusters/c-{ABUSER}/lab/api/events/subscribe"
    headers = {"Authorization": f"Bearer {token}"}
    waited = f"no message in {LAB_WAIT_S:.0f} s"

    def once() -> None:
        try:
            with connect(
                url,
                additional_headers=headers,
                origin=Origin(plane.url),
                open_timeout=10,
                close_timeout=1,
                max_size=None,
            ) as ws:
                ws.recv(timeout=LAB_WAIT_S)
            abuse.record("lab", "a message crossed", set())
        except ConnectionClosed as exc:  # closed with no message: the proxy dropped the bomb
            abuse.record("lab", f"closed {exc.rcvd.code if exc.rcvd else 'without a code'}", CLOSED)
        except TimeoutError:  # nothing crossed, the socket still open (the proxy drains the bomb)
            abuse.record("lab", waited, {waited})
        except InvalidStatus as exc:
            abuse.record("lab", exc.response.status_code, {429, 503})
        except OSError as exc:
            abuse.record("lab", type(exc).__name__, set())

    return once


def _get(
    api: httpx.Client, path: str, what: str, expected: Container[int], abuse: Abuse
) -> Callable[[], None]:
    """One GET of `path` by the abuser; its status recorded as `what`."""

    def once() -> None:
        try:
            abuse.record(what, api.get(path, timeout=30).status_code, expected)
        except httpx.HTTPError as exc:
            abuse.record(what, type(exc).__name__, set())

    return once


@contextlib.contextmanager
def _exec_flood(plane: ContainerPlane, token: str, abuse: Abuse) -> Iterator[None]:
    """`EXEC_STREAMS` exec streams held open (beyond the server's cap: 429)."""
    with plane.http(token) as api, contextlib.ExitStack() as held:
        body = {"command": ["sleep", "600"]}
        for _ in range(EXEC_STREAMS):
            url = f"/clusters/c-{ABUSER}/exec"
            answer = held.enter_context(api.stream("POST", url, json=body, timeout=60))
            if answer.status_code != 200:
                answer.read()
            abuse.record("exec", answer.status_code, {200, 429})
        yield


def _thread(target: Callable[..., None], *args: object) -> threading.Thread:
    return threading.Thread(target=target, args=args, daemon=True)


@pytest.mark.attack("29.fifo-log", "29.relay-flood", "29.log-bomb", "29.exec-flood", "29.lab-message")
def test_one_abusive_tenant_beside_twenty_clients(
    plane: ContainerPlane, image: str, security_figures: list[str]
) -> None:
    tokens, job = _setup(plane, image)
    abuser, cluster = plane.http(tokens[ABUSER]), f"c-{ABUSER}"
    for command in detached(WS_BOMB, LAB_PORT, BOMB_BYTES, name="ws-bomb"):
        _exec(abuser, cluster, command)
    _exec(abuser, cluster, ["sh", "-c", f"rm /var/log/jobs/{job}.log && mkfifo /var/log/jobs/{job}.log"])
    listening = lambda: "listening" in _exec(abuser, cluster, ["cat", "/tmp/ws-bomb.log"])  # noqa: E731
    wait_until(listening, 30, "the bomb to listen")
    time.sleep(1.0)
    rss_start, cpu_start, t0 = plane.rss_kib(), cpu_seconds(plane), time.perf_counter()
    stop, stats, abuse, samples, fds = threading.Event(), Stats(), Abuse(), [rss_start], [_fds(plane)]
    users = [u for u in tokens if u != ABUSER]
    clients = [
        _thread(_well_behaved, plane, u, tokens[u], k == 0, stop, stats, t0)
        for u in users
        for k in range(CLIENTS_EACH)
    ]
    clients += [_thread(monitor_rss, plane, stop, samples), _thread(_monitor_fds, plane, stop, fds)]
    job_log = _get(abuser, f"/jobs/{job}/logs", "job log", {409, 503, 504}, abuse)
    cluster_log = _get(abuser, f"/clusters/{cluster}/logs", "cluster log", {200, 503, 504}, abuse)
    abusers = [_thread(_loop, stop, 0.05, job_log) for _ in range(4)]
    abusers += [_thread(_loop, stop, 0.2, cluster_log) for _ in range(3)]
    abusers.append(_thread(_loop, stop, 0.2, _lab_bomb(plane, tokens[ABUSER], abuse)))
    started = time.monotonic()
    try:
        for thread in clients:
            thread.start()
        # the abuses inside the container, started with the abuser's own exec calls (before his exec
        # flood takes every exec slot he has), then the rest: all of them at once for DURATION_S
        for command in detached(FD_FLOOD, 5000, name="fd-flood"):
            _exec(abuser, cluster, command)
        _exec(abuser, cluster, ["sh", "-c", f"({' '.join(map(shlex.quote, log_bomb(LOG_BOMB_MIB)))}) &"])
        with _exec_flood(plane, tokens[ABUSER], abuse):
            for thread in abusers:
                thread.start()
            time.sleep(DURATION_S)
            stop.set()
            elapsed = time.monotonic() - started
            for thread in clients + abusers:
                thread.join(timeout=60)
            stopping = time.monotonic() - started - elapsed
        # the exec slots come back once the server notices the flood's clients are gone
        flood_log = wait_until(
            lambda: _exec_free(abuser, cluster, ["cat", "/tmp/fd-flood.log"]), 60, "an exec slot"
        )
        held = int(re.search(r"held (\d+)", _output(flood_log)).group(1))  # type: ignore[union-attr]
        container_log = abuser.get(f"/clusters/{cluster}/logs", timeout=60)
    finally:
        stop.set()
        abuser.close()
    rss_end, cpu = plane.rss_kib(), cpu_seconds(plane) - cpu_start
    log_text = (plane.root / "server.log").read_text(errors="replace")
    requests = len(stats.latencies)
    p50, p99 = stats.percentile(0.5) * 1000, stats.percentile(0.99) * 1000
    peak = max([*samples, rss_end])
    figures = [
        f"load+abuse: {requests} requests from {len(users) * CLIENTS_EACH} well-behaved clients in "
        f"{elapsed:.0f} s ({DURATION_S:.0f} s of all abuses at once; stopping {stopping:.1f} s); statuses "
        f"{dict(sorted(stats.statuses.items()))}; latency p50 {p50:.0f} ms, p99 {p99:.0f} ms, "
        f"max {max(stats.latencies, default=0) * 1000:.0f} ms",
        f"load+abuse: the abuser's answers {json.dumps(abuse.seen, sort_keys=True)}; he held {held} "
        f"connections to his API socket; his container log's answer {len(container_log.content)} bytes",
        f"load+abuse: server RSS start {rss_start / 1024:.0f} MiB, peak {peak / 1024:.0f} MiB "
        f"(+{(peak - rss_start) / 1024:.0f} MiB), end {rss_end / 1024:.0f} MiB; server CPU {cpu:.0f} s "
        f"({cpu / elapsed:.0%} of a core); descriptors start {fds[0]}, peak {max(fds)}; "
        f"load average {os.getloadavg()[0]:.1f}",
        "load+abuse: slowest: " + "; ".join(stats.slowest(3, access_log_ms(log_text))),
    ]
    print("\n" + "\n".join(figures))
    security_figures.extend(figures)
    assert not any(t.is_alive() for t in clients + abusers), "a client did not stop"
    assert not stats.errors, stats.errors[:5]
    assert requests > len(users) * CLIENTS_EACH * elapsed / 3, "the clients made too few requests"
    assert all(200 <= s < 300 for s in stats.statuses), stats.statuses
    assert p99 <= P99_BOUND_S * 1000, stats.slowest()
    assert peak - rss_start < RSS_BOUND_KIB, (rss_start, peak)
    assert not abuse.unexpected, abuse.unexpected
    assert {"job log", "cluster log", "exec", "lab"} <= set(abuse.seen), abuse.seen
    assert abuse.seen["exec"].get("429", 0) == EXEC_STREAMS - 8, abuse.seen["exec"]
    # the abuser holds 5,000 connections to his API socket: the server, a few hundred descriptors (the
    # relay's 64 connections, 2 each; the clients' connections, the exec streams' podman pipes)
    assert max(fds) - fds[0] < 500, fds
    assert held > 1000, flood_log  # the flood happened: far more than the relay's 64
    lines = container_log.text.splitlines()  # the bomb landed in his log; its answer, the tail only
    assert container_log.status_code == 200 and lines.count("x" * 99) > 5000, container_log.text[-300:]
    assert len(container_log.content) <= 1 << 20
