"""A tiny framed-JSON message transport over TCP, shared by the coordinator, agents and workers.

Each frame is a 4-byte big-endian length followed by a UTF-8 JSON object. A request carries an ``id``;
its reply carries ``reply_to`` with that id and may be sent later (the coordinator holds a ``join``
until the next generation forms). Frames without ``reply_to`` sent by the server are pushes.
The first frame on every connection is ``hello`` with the job token; anything else is dropped.

The server side is built to survive peers that do not hold the token: the hello must arrive whole
within `hello_timeout_s` and be at most `max_hello_bytes` (a longer length prefix closes the connection
before a byte of its body is read), the token is compared in constant time, connections above
`max_connections` (and unauthenticated ones above `max_unauthenticated`) are closed as they are
accepted, and bodies are read in chunks as they arrive, never allocated from the length prefix.
After the hello there is no read timeout (an agent may say nothing for the whole job), frames are
capped at `max_frame_bytes`, every message may be checked by `validate`, and a message that fails it,
or whose handler raises, ends that connection; `on_close` runs for every authenticated connection,
however it ends.
"""

from __future__ import annotations

import hmac
import itertools
import json
import logging
import socket
import struct
import threading
import time
from collections.abc import Callable
from typing import Any

from elastrain.errors import CoordinatorLost
from elastrain.rendezvous.messages import Kind, Message

log = logging.getLogger(__name__)

_HEADER = struct.Struct(">I")
_MAX_FRAME = 64 * 1024 * 1024  # what a client accepts from the coordinator (it trusts its server)
_CHUNK = 1024 * 1024
MAX_HELLO_BYTES = 64 * 1024
MAX_FRAME_BYTES = 8 * 1024 * 1024
HELLO_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 1024
MAX_UNAUTHENTICATED = 64


class Connection:
    """One framed-JSON socket; `send` is thread-safe, `recv` is for a single reader thread."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._send_lock = threading.Lock()
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

    def _read(self, size: int, deadline: float | None) -> bytes | None:
        """Exactly `size` bytes, read in chunks as they arrive; None on EOF, error or the deadline."""
        chunks: list[bytes] = []
        left = size
        while left > 0:
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                self.sock.settimeout(remaining)
            chunk = self.sock.recv(min(left, _CHUNK))
            if not chunk:
                return None
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)

    def recv(self, max_frame: int = _MAX_FRAME, deadline: float | None = None) -> Message | None:
        """Read one message; None on EOF, a broken connection, a frame over `max_frame` bytes, a body
        that is not a JSON object, or (with `deadline`, a `time.monotonic()` value) a frame that is not
        whole by then."""
        try:
            header = self._read(_HEADER.size, deadline)
            if header is None:
                return None
            (length,) = _HEADER.unpack(header)
            if length > max_frame:
                return None  # refused from the prefix alone: nothing of the body is read
            body = self._read(length, deadline)
            if body is None:
                return None
            msg = json.loads(body)
            return msg if isinstance(msg, dict) else None
        except (OSError, ValueError, RecursionError):
            return None
        finally:
            if deadline is not None and not self.closed:
                try:
                    self.sock.settimeout(None)
                except OSError:
                    pass

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
        reply = self.request(Kind.HELLO, token=token, **hello)
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
    now or later. ``on_close(peer)`` runs once when an authenticated connection ends, however it
    ends. ``validate(message)`` (optional) returns None for a well-formed message, else a reason:
    a hello that fails it is refused, a later message that fails it is answered with the reason and
    its connection closed. The limits are described in this module's docstring.
    """

    def __init__(
        self,
        host: str,
        port: int,
        token: str,
        on_message: Callable[[Peer, Message], None],
        on_close: Callable[[Peer], None],
        *,
        validate: Callable[[Message], str | None] | None = None,
        max_connections: int = MAX_CONNECTIONS,
        max_unauthenticated: int = MAX_UNAUTHENTICATED,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
        max_hello_bytes: int = MAX_HELLO_BYTES,
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.token = token
        self._token = token.encode()
        self._on_message = on_message
        self._on_close = on_close
        self._validate = validate
        self.max_connections = max_connections
        self.max_unauthenticated = max_unauthenticated
        self.hello_timeout_s = hello_timeout_s
        self.max_hello_bytes = max_hello_bytes
        self.max_frame_bytes = max_frame_bytes
        self._listener = socket.create_server((host, port), reuse_port=False, backlog=256)
        self.address = f"{host}:{self._listener.getsockname()[1]}"
        self._stopped = False
        self._peers: set[Peer] = set()
        self._open = 0  # connections with a thread (authenticated or not)
        self._unauthenticated = 0
        self.refused = 0  # connections closed at once because a cap was reached
        self._lock = threading.Lock()
        threading.Thread(target=self._accept_loop, name="elastrain-accept", daemon=True).start()

    @property
    def open_connections(self) -> tuple[int, int]:
        """(connections being served, of which not yet authenticated)."""
        with self._lock:
            return self._open, self._unauthenticated

    def _accept_loop(self) -> None:
        while not self._stopped:
            try:
                sock, _ = self._listener.accept()
            except OSError:
                if self._stopped:
                    return
                time.sleep(0.05)  # e.g. out of file descriptors: do not spin, do not stop serving
                continue
            with self._lock:
                full = self._open >= self.max_connections or self._unauthenticated >= self.max_unauthenticated
                if not full:
                    self._open += 1
                    self._unauthenticated += 1
                else:
                    self.refused += 1
            if full:
                if self.refused in (1, 10, 100, 1000) or self.refused % 10000 == 0:
                    log.warning("connection cap reached: %d connections refused so far", self.refused)
                sock.close()
                continue
            try:
                peer = Peer(Connection(sock))
                threading.Thread(target=self._serve, args=(peer,), name="elastrain-peer", daemon=True).start()
            except (OSError, RuntimeError):  # reset before we got to it, or no thread to be had
                sock.close()
                with self._lock:
                    self._open -= 1
                    self._unauthenticated -= 1

    def _check_hello(self, hello: Message | None) -> str | None:
        if hello is None:
            return "no hello"
        token = hello.get("token")
        if (
            hello.get("type") != Kind.HELLO
            or not isinstance(token, str)
            or not hmac.compare_digest(token.encode(), self._token)
        ):
            return "bad job token"
        return self._validate(hello) if self._validate is not None else None

    def _serve(self, peer: Peer) -> None:
        authenticated = False
        try:
            deadline = time.monotonic() + self.hello_timeout_s
            hello = peer.conn.recv(self.max_hello_bytes, deadline=deadline)
            refused = self._check_hello(hello)
            if refused is not None:
                if hello is not None:
                    peer.conn.sock.settimeout(1.0)  # never wait on a peer that does not read
                    peer.reply(hello, ok=False, error=refused)
                return
            assert hello is not None
            peer.info = {k: v for k, v in hello.items() if k not in ("token", "id", "type")}
            with self._lock:
                self._unauthenticated -= 1
                self._peers.add(peer)
                authenticated = True
            if not self._dispatch(peer, hello):
                return
            while not peer.conn.closed:
                msg = peer.conn.recv(self.max_frame_bytes)
                if msg is None:
                    break
                if msg.get("type") == Kind.HELLO:
                    peer.reply(msg, ok=False, error="already greeted")
                    break
                reason = self._validate(msg) if self._validate is not None else None
                if reason is not None:
                    log.warning("dropping %s: malformed %r message (%s)", peer.name, msg.get("type"), reason)
                    peer.reply(msg, ok=False, error=f"malformed message: {reason}")
                    break
                if not self._dispatch(peer, msg):
                    break
        finally:
            peer.conn.close()
            with self._lock:
                self._open -= 1
                if authenticated:
                    self._peers.discard(peer)
                else:
                    self._unauthenticated -= 1
            if authenticated:
                try:
                    self._on_close(peer)
                except Exception:
                    log.exception("cleaning up after %s failed", peer.name)

    def _dispatch(self, peer: Peer, msg: Message) -> bool:
        """Hand `msg` to the handler; False (the connection ends) when the handler raised."""
        try:
            self._on_message(peer, msg)
            return True
        except Exception:
            log.exception("handling %r from %s failed; closing its connection", msg.get("type"), peer.name)
            peer.reply(msg, ok=False, error="internal error handling this message")
            return False

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

    @property
    def name(self) -> str:
        """Who this is, for logs."""
        who = self.info.get("worker_id") or self.info.get("host") or "unauthenticated peer"
        return f"{who} ({self.address})"

    def reply(self, request: Message, **fields: Any) -> bool:
        """Answer `request` (matched by its id)."""
        return self.conn.send({"reply_to": request.get("id"), **fields})

    def push(self, kind: str, **fields: Any) -> bool:
        """Send an unsolicited message."""
        return self.conn.send({"type": kind, **fields})
