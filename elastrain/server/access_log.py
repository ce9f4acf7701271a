"""The access log: one line per HTTP request or WebSocket, each with a request id.

`AccessLogMiddleware` is a pure ASGI middleware (it never buffers a body). It

- takes the request id from a well-formed ``X-Request-ID`` header (1-64 of ``A-Za-z0-9._:-``) or makes
  one (32 hex digits), and returns it in the ``X-Request-ID`` response header (on a WebSocket: in the
  handshake answer);
- logs, once the request is over, one line (stamped with its start time) to the ``elastrain.access``
  logger (INFO)::

    2025-01-02T03:04:05.678Z id=5f0c... client=127.0.0.1:51234 user=alice method=GET
    path=/api/v1/clusters status=200 ms=3.1 bytes=412

  WebSockets log ``method=WS``, ``status=101`` once accepted (403 when refused before) and the
  app's close code (``close=4401``); ``ms`` is the connection's lifetime, ``bytes`` what was sent.

Nothing secret is logged: no query string, no header, no body; the path is percent-quoted (no
control characters reach the log). ``user`` is the name that `Services.authenticate` found for the
request's token (``-`` when there was none; it calls `note_user`).

`install` puts the middleware outside every other one (outside Starlette's error middleware too,
so a 500 carries the id) and gives ``elastrain.access`` a stderr handler when it has none, so
``elastrain server`` prints the access log by default.
"""

from __future__ import annotations

import logging
import re
import sys
import time
import uuid
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote

from starlette.types import ASGIApp, Message, Receive, Scope, Send

LOGGER_NAME = "elastrain.access"
HEADER = "X-Request-ID"
_HEADER_KEY = b"x-request-id"
_VALID_ID = re.compile(r"[A-Za-z0-9._:-]{1,64}")
_PATH_SAFE = "/:@!$&'()*+,;=-._~%"
_MAX_PATH = 512
_NAME = re.compile(r"[A-Za-z0-9._@-]{1,64}")


@dataclass
class RequestRecord:
    """What the access line of one request says; `note_user` fills `user` while the request runs."""

    request_id: str
    user: str | None = None


_current: ContextVar[RequestRecord | None] = ContextVar("elastrain_request", default=None)


def current_request_id() -> str | None:
    """The id of the request being served (None outside a request)."""
    record = _current.get()
    return record.request_id if record is not None else None


def note_user(name: str) -> None:
    """Record the authenticated user of the current request (for its access line)."""
    record = _current.get()
    if record is not None:
        record.user = name


def request_id_from(headers: list[tuple[bytes, bytes]] | Any) -> str:
    """The incoming ``X-Request-ID`` when well formed, else a new random id."""
    for key, value in headers or ():
        if key.lower() == _HEADER_KEY:
            candidate = value.decode("latin-1").strip()
            if _VALID_ID.fullmatch(candidate):
                return candidate
            break
    return uuid.uuid4().hex


def _with_id(headers: Any, request_id: str) -> list[tuple[bytes, bytes]]:
    """`headers` without any ``X-Request-ID`` of the app's, plus ours."""
    kept = [(k, v) for k, v in headers or () if bytes(k).lower() != _HEADER_KEY]
    return [*kept, (_HEADER_KEY, request_id.encode("latin-1"))]


def _safe(value: str, pattern: re.Pattern[str] = _NAME) -> str:
    return value if pattern.fullmatch(value) else quote(value[:64], safe="")


class AccessLogMiddleware:
    """See the module docstring."""

    def __init__(self, app: ASGIApp, *, logger: logging.Logger | None = None) -> None:
        self.app = app
        self.log = logger if logger is not None else logging.getLogger(LOGGER_NAME)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        record = RequestRecord(request_id_from(scope.get("headers")))
        context = _current.set(record)
        at = datetime.now(timezone.utc)
        started = time.perf_counter()
        status: int | None = None
        close_code: int | None = None
        sent = 0

        async def send_with_id(message: Message) -> None:
            nonlocal status, close_code, sent
            kind_ = message["type"]
            if kind_ in ("http.response.start", "websocket.http.response.start"):
                status = int(message["status"])
                message = {**message, "headers": _with_id(message.get("headers"), record.request_id)}
            elif kind_ == "websocket.accept":
                status = 101
                message = {**message, "headers": _with_id(message.get("headers"), record.request_id)}
            elif kind_ in ("http.response.body", "websocket.http.response.body"):
                sent += len(message.get("body", b""))
            elif kind_ == "websocket.send":
                data = message.get("bytes")
                sent += len(data) if data is not None else len(str(message.get("text") or "").encode())
            elif kind_ == "websocket.close":
                close_code = int(message.get("code", 1000))
                if status is None:
                    status = 403  # closed before the handshake: the server answers 403
            await send(message)

        failed = False
        try:
            await self.app(scope, receive, send_with_id)
        except BaseException:
            failed = True
            raise
        finally:
            _current.reset(context)
            if status is None and failed:
                status = 500
            self._log(scope, record, at, status, close_code, time.perf_counter() - started, sent)

    def _log(
        self,
        scope: Scope,
        record: RequestRecord,
        at: datetime,
        status: int | None,
        close_code: int | None,
        seconds: float,
        sent: int,
    ) -> None:
        if not self.log.isEnabledFor(logging.INFO):
            return
        client = scope.get("client")
        where = f"{client[0]}:{client[1]}" if client else "-"
        method = "WS" if scope["type"] == "websocket" else _safe(str(scope.get("method", "-")))
        path = quote(str(scope.get("path", ""))[:_MAX_PATH], safe=_PATH_SAFE) or "/"
        user = _safe(record.user) if record.user else "-"
        when = at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
        line = (
            f"{when} id={record.request_id} client={where} user={user} method={method} path={path} "
            f"status={status if status is not None else '-'} ms={seconds * 1000:.1f} bytes={sent}"
        )
        if close_code is not None:
            line += f" close={close_code}"
        self.log.info("%s", line)


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever ``sys.stderr`` is when a line is logged (test runners swap it)."""

    def __init__(self) -> None:
        super().__init__(sys.stderr)

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


def configure_logger(logger: logging.Logger | None = None) -> logging.Logger:
    """Give ``elastrain.access`` a stderr handler at INFO unless it already has a handler.

    The line goes to that handler only (``propagate`` off), so ``-v`` does not print it twice.
    """
    logger = logger if logger is not None else logging.getLogger(LOGGER_NAME)
    if not logger.handlers:
        handler = _StderrHandler()
        handler.setFormatter(logging.Formatter("elastrain access: %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
        logger.propagate = False
    return logger


def install(app: Any) -> None:
    """Make `AccessLogMiddleware` the outermost layer of `app` and configure the access logger.

    The line names the user that `Services.authenticate` found (it calls `note_user`), without a
    second token lookup.
    """
    build = app.build_middleware_stack
    if not getattr(build, "_access_log", False):

        def build_with_access_log() -> ASGIApp:
            return AccessLogMiddleware(build())

        build_with_access_log._access_log = True  # type: ignore[attr-defined]
        app.build_middleware_stack = build_with_access_log
    configure_logger()
