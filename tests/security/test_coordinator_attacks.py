"""Attacks on the coordinator's RPC port: exhaustion before authentication, token guessing, and a
fuzzed frame stream from peers that hold the token. Each runs against a real in-process `Coordinator`
listening on a real socket.
"""

from __future__ import annotations

import json
import random
import socket
import struct
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from elastrain.rendezvous.api import WorkerState
from elastrain.rendezvous.coordinator import Coordinator
from elastrain.rendezvous.records import LIVE, CoordinatorConfig
from elastrain.rendezvous.wire import RpcClient, parse_address
from elastrain.testing.waits import poll

pytestmark = pytest.mark.timeout(60)

TOKEN = "0123456789abcdef0123456789abcdef"
HELLO_TIMEOUT_S = 2.0


@pytest.fixture
def coordinator() -> Iterator[Coordinator]:
    config = CoordinatorConfig(
        min_np=1,
        max_np=4,
        initial_np=1,
        join_grace_s=600.0,
        start_timeout_s=600.0,
        elastic_timeout_s=600.0,
        heartbeat_timeout_s=600.0,
        hello_timeout_s=HELLO_TIMEOUT_S,
    )
    coord = Coordinator(config, TOKEN, "127.0.0.1:1", lambda host: None)
    yield coord
    coord.close()


def connect(coord: Coordinator) -> socket.socket:
    sock = socket.create_connection(parse_address(coord.address), timeout=5)
    return sock


def frame(msg: Any) -> bytes:
    data = json.dumps(msg).encode()
    return struct.pack(">I", len(data)) + data


def read_frame(sock: socket.socket, timeout: float = 5.0) -> dict[str, Any] | None:
    sock.settimeout(timeout)
    data = b""
    try:
        while len(data) < 4:
            chunk = sock.recv(4 - len(data))
            if not chunk:
                return None
            data += chunk
        (length,) = struct.unpack(">I", data)
        body = b""
        while len(body) < length:
            chunk = sock.recv(length - len(body))
            if not chunk:
                return None
            body += chunk
    except (ConnectionResetError, BrokenPipeError):
        return None
    msg: dict[str, Any] = json.loads(body)
    return msg


def closed_by_server(sock: socket.socket, within: float) -> bool:
    """True when the server closed `sock` within `within` seconds (EOF or reset)."""
    sock.settimeout(within)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


def rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def legit_worker_joins(coord: Coordinator, worker_id: str = "legit-0") -> None:
    client = RpcClient(
        coord.address,
        TOKEN,
        {"role": "worker", "worker_id": worker_id, "host": "h1", "local_rank": 0, "pid": 1},
        connect_timeout=5,
    )
    try:
        assert client.connected
        assert client.notify("heartbeat")
        assert poll(lambda: coord.workers.get(worker_id) is not None, 5, 0.02)
        assert coord.workers[worker_id].peer is not None
    finally:
        client.close()


def no_ghosts(coord: Coordinator) -> bool:
    """Nothing is recorded as connected whose connection is gone."""
    with coord._lock:
        live_workers = [
            w for w in coord.workers.values() if w.state in LIVE and w.peer is not None and w.peer.conn.closed
        ]
        ghost_agents = [h for h, p in coord.agents.items() if p.conn.closed]
    return not live_workers and not ghost_agents


@pytest.mark.attack
def test_half_sent_frames_are_bounded_and_closed_by_the_deadline(coordinator: Coordinator) -> None:
    before = threading.active_count()
    socks = []
    for _ in range(100):
        sock = connect(coordinator)
        sock.sendall(struct.pack(">I", 200) + b'{"type": "hel')  # never finished
        socks.append(sock)
    time.sleep(0.3)
    limits = coordinator.server.max_unauthenticated
    assert threading.active_count() <= before + limits + 2
    open_now, unauthenticated = coordinator.server.open_connections
    assert unauthenticated <= limits and open_now <= limits
    started = time.monotonic()
    assert all(closed_by_server(s, HELLO_TIMEOUT_S + 2.0) for s in socks)
    assert time.monotonic() - started < HELLO_TIMEOUT_S + 2.0
    for sock in socks:
        sock.close()
    assert poll(lambda: coordinator.server.open_connections == (0, 0), 2, 0.02)
    assert poll(lambda: threading.active_count() <= before + 2, 2, 0.02)
    legit_worker_joins(coordinator)


@pytest.mark.attack
def test_slowloris_hello_is_cut_at_the_deadline(coordinator: Coordinator) -> None:
    sock = connect(coordinator)
    body = frame({"type": "hello", "token": TOKEN, "role": "agent", "host": "h1", "id": 1})
    started = time.monotonic()
    closed = False
    for byte in body:  # one byte every 0.3 s: each read is quick, the whole hello is not
        try:
            sock.sendall(bytes([byte]))
        except OSError:
            closed = True
            break
        time.sleep(0.3)
        if time.monotonic() - started > HELLO_TIMEOUT_S + 1.5:
            break
    assert closed or closed_by_server(sock, 1.0)
    assert time.monotonic() - started < HELLO_TIMEOUT_S + 2.0
    assert "h1" not in coordinator.agents
    sock.close()


@pytest.mark.attack
def test_huge_length_prefix_is_refused_without_buffering(coordinator: Coordinator) -> None:
    rss_before = rss_bytes()
    socks = [connect(coordinator) for _ in range(4)]
    payload = b"x" * (1024 * 1024)
    for sock in socks:
        sock.sendall(struct.pack(">I", 30 * 1024 * 1024))
    started = time.monotonic()
    for sock in socks:
        assert closed_by_server(sock, 1.5)  # at once, long before the hello deadline
    assert time.monotonic() - started < 1.5
    for sock in socks:
        try:  # the rest of the 30 MiB goes nowhere
            for _ in range(30):
                sock.sendall(payload)
        except OSError:
            pass
        sock.close()
    assert rss_bytes() - rss_before < 16 * 1024 * 1024
    # an authenticated peer is capped too (8 MiB here), and disconnected from the prefix alone
    client = RpcClient(
        coordinator.address, TOKEN, {"role": "agent", "host": "h1", "pid": 1}, connect_timeout=5
    )
    client.conn.sock.sendall(struct.pack(">I", 30 * 1024 * 1024))
    assert poll(lambda: not client.connected, 2, 0.02)
    assert poll(lambda: "h1" not in coordinator.agents, 2, 0.02)
    legit_worker_joins(coordinator)


@pytest.mark.attack
def test_wrong_token_of_equal_length_is_refused(coordinator: Coordinator) -> None:
    wrong = TOKEN[:-1] + ("0" if TOKEN[-1] != "0" else "1")
    assert len(wrong) == len(TOKEN)
    for token in (wrong, "", TOKEN + "x", 12345, None, [TOKEN]):
        sock = connect(coordinator)
        sock.sendall(frame({"type": "hello", "id": 1, "token": token, "role": "agent", "host": "evil"}))
        reply = read_frame(sock)
        assert reply is not None and reply["ok"] is False and reply["error"] == "bad job token"
        assert closed_by_server(sock, 2.0)
        sock.close()
    assert "evil" not in coordinator.agents
    with pytest.raises(Exception, match="refused"):
        RpcClient(coordinator.address, wrong, {"role": "agent", "host": "evil", "pid": 1}, connect_timeout=5)
    assert poll(lambda: coordinator.server.open_connections == (0, 0), 2, 0.02)


# ----- fuzzing an authenticated peer ----------------------------------------------------------------
_WEIRD: list[Any] = [
    None,
    True,
    -1,
    0,
    2**70,
    -(2**70),
    1.5,
    float("nan"),
    float("inf"),
    "",
    "x" * 5000,
    [],
    [1, "a"],
    {},
    {"a": {"b": []}},
]
_GENERATION = {
    "number": 3,
    "members": [{"worker_id": "w", "host": "h1", "pid": 1, "committed_step": 5, "port": 0, "address": ""}],
    "cause": "start",
    "store_address": "127.0.0.1:1",
    "src_rank": 0,
    "sync_state": True,
}
_TEMPLATES: dict[str, dict[str, Any]] = {
    "heartbeat": {},
    "progress": {"generation": 1, "at": 1.0},
    "worker_started": {"worker_id": "w", "pid": 1},
    "worker_exited": {"worker_id": "w", "returncode": 0, "tail": ""},
    "join": {"committed_step": 1, "port": 1, "pid": 1},
    "leave": {},
    "done": {},
    "user_error": {"traceback": "t"},
    "hello": {"role": "worker", "worker_id": "w", "host": "h1", "local_rank": 0, "pid": 1, "run_id": ""},
}


def _mutated(rng: random.Random, kind: str, worker_id: str) -> dict[str, Any]:
    msg: dict[str, Any] = {"type": kind, "id": rng.randint(1, 1000), **_TEMPLATES[kind]}
    if "worker_id" in msg:
        msg["worker_id"] = worker_id
    keys = [k for k in msg if k != "type"] + ["rejoin", "generation", "role", "host"]
    for _ in range(rng.randint(1, 3)):
        key = rng.choice(keys)
        if key == "rejoin":
            generation = json.loads(json.dumps(_GENERATION))
            target = rng.choice([generation, generation["members"][0]])
            target[rng.choice(list(target))] = rng.choice(_WEIRD)
            msg["rejoin"] = rng.choice([{"generation": generation, "committed_step": 1}, rng.choice(_WEIRD)])
        else:
            msg[key] = rng.choice(_WEIRD)
    return msg


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    choice = rng.randrange(6 if depth < 4 else 4)
    if choice == 0:
        return rng.choice(_WEIRD)
    if choice == 1:
        return rng.randint(-(2**40), 2**40)
    if choice == 2:
        return "".join(chr(rng.randrange(32, 0x2FFF)) for _ in range(rng.randrange(20)))
    if choice == 3:
        return rng.random()
    if choice == 4:
        return [_random_json(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {
        str(rng.choice([*list(_TEMPLATES), "type", "id", "x"])): _random_json(rng, depth + 1)
        for _ in range(3)
    }


def _fuzz_frame(rng: random.Random, worker_id: str) -> bytes:
    case = rng.randrange(7)
    if case == 0:  # random bytes behind a random (small) length
        junk = bytes(rng.randrange(256) for _ in range(rng.randrange(64)))
        return struct.pack(">I", rng.randrange(128)) + junk
    if case == 1:  # a length prefix far over the cap
        return struct.pack(">I", rng.randrange(9 * 1024 * 1024, 2**32))
    if case == 2:  # random JSON
        return frame(_random_json(rng))
    if case == 3:  # deeply nested JSON
        return frame_raw(b"[" * 100000 + b"]" * 100000)
    if case == 4:  # an unknown type with a weird value
        return frame({"type": rng.choice([*_WEIRD, "nope"]), "id": 1})
    kind = rng.choice(list(_TEMPLATES))
    return frame(_mutated(rng, kind, worker_id))


def frame_raw(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def _authenticated(coord: Coordinator, role: str, name: str) -> socket.socket:
    sock = connect(coord)
    if role == "agent":
        hello = {"type": "hello", "id": 1, "token": TOKEN, "role": "agent", "host": name, "pid": 1}
    else:
        hello = {"type": "hello", "id": 1, "token": TOKEN, "role": "worker", "worker_id": name, "host": "h1"}
    sock.sendall(frame(hello))
    reply = read_frame(sock)
    assert reply is not None and reply.get("ok") is True, reply
    return sock


@pytest.mark.attack
def test_fuzzed_frames_from_authenticated_peers(coordinator: Coordinator) -> None:
    rng = random.Random(14)
    threads = {t.name for t in threading.enumerate()}
    assert {"elastrain-accept", "elastrain-coord-tick"} <= threads
    deadline = time.monotonic() + 12
    cases = 0
    while time.monotonic() < deadline and cases < 300:
        role = rng.choice(["agent", "worker"])
        name = f"fz-{cases}"
        sock = _authenticated(coordinator, role, name)
        for _ in range(rng.randint(1, 4)):
            try:
                sock.sendall(_fuzz_frame(rng, name))
            except OSError:
                break  # the coordinator hung up on us: that is allowed
        if rng.random() < 0.5:
            sock.close()
        else:
            try:
                sock.shutdown(socket.SHUT_WR)
                closed_by_server(sock, 0.2)
            except OSError:
                pass  # already closed by the coordinator
            sock.close()
        cases += 1
    assert cases >= 50
    assert poll(lambda: coordinator.server.open_connections == (0, 0), 5, 0.02)
    assert poll(lambda: no_ghosts(coordinator), 5, 0.02)
    with coordinator._lock:
        assert not coordinator.agents
        assert all(w.state not in LIVE for w in coordinator.workers.values() if w.worker_id.startswith("fz-"))
    alive = {t.name for t in threading.enumerate()}
    assert {"elastrain-accept", "elastrain-coord-tick"} <= alive
    legit_worker_joins(coordinator, "legit-after-fuzz")


@pytest.mark.attack
def test_malformed_message_disconnects_and_cleans_up(coordinator: Coordinator) -> None:
    sock = _authenticated(coordinator, "worker", "w-bad")
    assert coordinator.workers["w-bad"].state == WorkerState.STARTING
    sock.sendall(frame({"type": "join", "id": 7, "committed_step": {"x": 1}}))
    reply = read_frame(sock)
    assert reply is not None and reply["reply_to"] == 7 and reply["ok"] is False
    assert "committed_step" in reply["error"]
    assert closed_by_server(sock, 2.0)
    sock.close()
    assert poll(lambda: coordinator.workers["w-bad"].state == WorkerState.DEAD, 2, 0.02)
    agent = _authenticated(coordinator, "agent", "h9")
    agent.sendall(frame({"type": "hello", "id": 2, "token": TOKEN, "role": "agent", "host": "h10"}))
    assert closed_by_server(agent, 2.0)
    agent.close()
    assert poll(lambda: not coordinator.agents, 2, 0.02)
    legit_worker_joins(coordinator)
