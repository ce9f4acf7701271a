"""A tiny framed-JSON message transport over TCP, shared by the coordinator, agents and workers.

Each frame is a 4-byte big-endian length followed by a UTF-8 JSON object. A request carries an ``id``;
its reply carries ``reply_to`` with that id and may be sent later (the coordinator holds a ``join``
until the next generation forms). Frames without ``reply_to`` sent by the server are pushes.
The first frame on every connection is ``hello`` with the job token; anything else is dropped.
"""

from __future__ import annotations

import itertools
import json
import logging
import socket
import struct
import threading
from collections.abc import Callable
from typing import Any

from elastrain.errors import CoordinatorLost

log = logging.getLogger(__name__)

Message = dict[str, Any]
_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 1024 * 1024


class Connection:
    """One framed-JSON socket; `send` is thread-safe, `recv` is for a single reader thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()
        self._rfile = sock.makefile("rb")
        self.closed = False

    def send(self, msg: Message) -> bool:
        """Send one message; returns False (instead of raising) when the peer is gone."""
        data = json.dumps(msg, separators=(",", ":")).encode()
        try:
            with self._send_lock:
                self.sock.sendall(_HEADER.pack(len(data)) + data)
            return True
        except OSError:
            self.close()
            return False

    def recv(self) -> Message | None:
        """Read one message; None on EOF or a broken connection."""
        try:
            header = self._rfile.read(_HEADER.size)
            if len(header) < _HEADER.size:
                return None
            (length,) = _HEADER.unpack(header)
            if length > _MAX_FRAME:
                return None
            body = self._rfile.read(length)
            if len(body) < length:
                return None
            msg = json.loads(body)
            return msg if isinstance(msg, dict) else None
        except (OSError, ValueError):
            return None

    def close(self) -> None:
        """Close the socket (idempotent)."""
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self.sock.close()


def parse_address(address: str) -> tuple[str, int]:
    """Split ``host:port`` into its parts."""
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"{address!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


class RpcClient:
    """Client side: request/reply with ids, plus a callback for pushes and for disconnects."""

    def __init__(
        self,
        address: str,
        token: str,
        hello: Message,
        on_push: Callable[[Message], None] | None = None,
        on_disconnect: Callable[[], None] | None = None,
        connect_timeout: float = 30.0,
    ) -> None:
        self.address = address
        host, port = parse_address(address)
        try:
            sock = socket.create_connection((host, port), timeout=connect_timeout)
        except OSError as exc:
            raise CoordinatorLost(
                f"cannot reach the coordinator at {address} ({exc}); is `elastrain run` still running?"
            ) from None
        sock.settimeout(None)
        self.conn = Connection(sock)
        self._on_push = on_push
        self._on_disconnect = on_disconnect
        self._ids = itertools.count(1)
        self._waiting: dict[int, list[Any]] = {}
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="elastrain-rpc", daemon=True)
        self._reader.start()
        reply = self.request("hello", token=token, **hello)
        if not reply.get("ok"):
            self.close()
            raise CoordinatorLost(f"coordinator at {address} refused us: {reply.get('error', 'no reason')}")

    def request(self, kind: str, timeout: float | None = None, **fields: Any) -> Message:
        """Send a request and block until its reply arrives (or the connection breaks)."""
        rid = next(self._ids)
        slot: list[Any] = [threading.Event(), None]
        with self._lock:
            self._waiting[rid] = slot
        if not self.conn.send({"type": kind, "id": rid, **fields}):
            raise CoordinatorLost(f"lost the coordinator at {self.address} while sending {kind!r}")
        if not slot[0].wait(timeout):
            with self._lock:
                self._waiting.pop(rid, None)
            raise CoordinatorLost(
                f"no answer from the coordinator at {self.address} to {kind!r} in {timeout}s"
            )
        if slot[1] is None:
            raise CoordinatorLost(f"lost the coordinator at {self.address} while waiting for {kind!r}")
        reply: Message = slot[1]
        return reply

    def notify(self, kind: str, **fields: Any) -> bool:
        """Send a message that expects no reply."""
        return self.conn.send({"type": kind, **fields})

    def _read_loop(self) -> None:
        while True:
            msg = self.conn.recv()
            if msg is None:
                break
            rid = msg.get("reply_to")
            if rid is not None:
                with self._lock:
                    slot = self._waiting.pop(rid, None)
                if slot is not None:
                    slot[1] = msg
                    slot[0].set()
            elif self._on_push is not None:
                try:
                    self._on_push(msg)
                except Exception:  # a push handler must never kill the reader
                    log.exception("push handler failed for %s", msg.get("type"))
        self.conn.close()
        with self._lock:
            waiting, self._waiting = self._waiting, {}
        for slot in waiting.values():
            slot[0].set()
        if self._on_disconnect is not None:
            self._on_disconnect()

    @property
    def connected(self) -> bool:
        """False once the connection has broken or been closed."""
        return not self.conn.closed

    def close(self) -> None:
        """Close the connection; waiting requests fail with CoordinatorLost."""
        self.conn.close()


class RpcServer:
    """Server side: accepts connections, authenticates ``hello``, hands every message to a handler.

    The handler gets ``(peer, message)`` and replies through ``peer.reply(message, **fields)``,
    now or later. ``on_close(peer)`` runs once when a connection ends.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        on_message: Callable[[Peer, Message], None],
        on_close: Callable[[Peer], None],
    ) -> None:
        self.token = token
        self._on_message = on_message
        self._on_close = on_close
        self._listener = socket.create_server((host, port), reuse_port=False, backlog=256)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._stopped = False
        self._peers: set[Peer] = set()
        self._lock = threading.Lock()
        threading.Thread(target=self._accept_loop, name="elastrain-accept", daemon=True).start()

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                return
            peer = Peer(Connection(sock))
            threading.Thread(target=self._serve, args=(peer,), name="elastrain-peer", daemon=True).start()

    def _serve(self, peer: Peer) -> None:
        hello = peer.conn.recv()
        if hello is None or hello.get("type") != "hello" or hello.get("token") != self.token:
            if hello is not None:
                peer.reply(hello, ok=False, error="bad job token")
            peer.conn.close()
            return
        peer.info = {k: v for k, v in hello.items() if k not in ("token", "id", "type")}
        with self._lock:
            self._peers.add(peer)
        self._on_message(peer, hello)
        while True:
            msg = peer.conn.recv()
            if msg is None:
                break
            self._on_message(peer, msg)
        peer.conn.close()
        with self._lock:
            self._peers.discard(peer)
        self._on_close(peer)

    def close(self) -> None:
        """Stop accepting and close every connection."""
        self._stopped = True
        self._listener.close()
        with self._lock:
            peers = list(self._peers)
        for peer in peers:
            peer.conn.close()


class Peer:
    """A connected client as the server sees it."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.info: Message = {}
        try:
            self.address = str(conn.sock.getpeername()[0])
        except OSError:
            self.address = ""

    def reply(self, request: Message, **fields: Any) -> bool:
        """Answer `request` (matched by its id)."""
        return self.conn.send({"reply_to": request.get("id"), **fields})

    def push(self, kind: str, **fields: Any) -> bool:
        """Send an unsolicited message."""
        return self.conn.send({"type": kind, **fields})
