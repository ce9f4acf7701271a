"""Request-body limits: authenticate before reading a body under ``/api/``, and cap every body.

`BodyLimitMiddleware` is a pure ASGI middleware (it never buffers a body):

- a request under ``/api/`` that carries a body (``Content-Length > 0`` or ``Transfer-Encoding``)
  and no credential that `authorized` accepts is answered 401 before one byte of the body is read;
- a declared ``Content-Length`` above the cap is answered 413 at once;
- a body that grows past the cap while it is read (chunked, or a lying client) is answered 413.

Refusals carry ``Connection: close``: the server does not read (nor keep) what the client still sends.
They are problem details like every other refusal: `error` is `elastrain.server.problems.problem_response`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from elastrain.errors import ConfigError

DEFAULT_MAX_BODY_BYTES = 1 << 20
MAX_BODY_ENV = "ELASTRAIN_MAX_BODY_BYTES"

Authorizer = Callable[[str, Mapping[str, str]], bool]
"""``(path, lower-cased headers) -> whether the request carries a valid credential`` (may block)."""
ErrorResponse = Callable[[int, str, str], Response]
"""``(status, detail, request path) -> the refusal`` (problem details)."""


def resolve_max_body_bytes(value: int | None = None, environ: Mapping[str, str] | None = None) -> int:
    """The cap: `value` (``--max-body-bytes``), else ``$ELASTRAIN_MAX_BODY_BYTES``, else 1 MiB."""
    env = os.environ if environ is None else environ
    where = "--max-body-bytes"
    if value is None and env.get(MAX_BODY_ENV, "").strip():
        where = MAX_BODY_ENV
        try:
            value = int(env[MAX_BODY_ENV].strip())
        except ValueError:
            raise ConfigError(f"{MAX_BODY_ENV}={env[MAX_BODY_ENV]!r} is not a number of bytes") from None
    if value is None:
        return DEFAULT_MAX_BODY_BYTES
    if value < 1024:
        raise ConfigError(f"{where} must be at least 1024 bytes (got {value})")
    return value


class BodyTooLarge(HTTPException):
    """Raised from `receive` when a body grows past the cap (FastAPI re-raises HTTPExceptions)."""

    def __init__(self, limit: int) -> None:
        super().__init__(413, too_large_message(limit), headers={"Connection": "close"})


def too_large_message(limit: int) -> str:
    return f"request body too large: at most {limit} bytes (server setting --max-body-bytes)"


class BodyLimitMiddleware:
    """See the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        authorized: Authorizer,
        error: ErrorResponse,
        protected_prefix: str = "/api/",
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.authorized = authorized
        self.error = error
        self.protected_prefix = protected_prefix

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, status: int, message: str) -> None:
        raw = scope.get("raw_path")  # as sent (percent-encoded): never markup echoed back
        where = raw.decode("latin-1") if isinstance(raw, bytes) and raw else str(scope.get("path", ""))
        response = self.error(status, message, where.split("?", 1)[0])
        response.headers["Connection"] = "close"
        await response(scope, receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[str, str] = {}
        for key, value in scope.get("headers", ()):
            headers[key.decode("latin-1").lower()] = value.decode("latin-1")
        declared = headers.get("content-length")
        length: int | None = None
        if declared is not None:
            try:
                length = int(declared.strip())
            except ValueError:
                await self._refuse(scope, receive, send, 400, f"invalid Content-Length {declared[:40]!r}")
                return
        has_body = "transfer-encoding" in headers or bool(length)
        if not has_body:
            await self.app(scope, receive, send)
            return
        path: str = scope.get("path", "")
        if path.startswith(self.protected_prefix) and not await run_in_threadpool(
            self.authorized, path, headers
        ):
            await self._refuse(
                scope,
                receive,
                send,
                401,
                "a request body needs a valid credential: Authorization: Bearer TOKEN (ELASTRAIN_TOKEN), "
                "or where the route takes one the job's X-Job-Token or a launcher shell's X-Attach-Token "
                "(ELASTRAIN_ATTACH_TOKEN)",
            )
            return
        if length is not None and length > self.max_body_bytes:
            await self._refuse(scope, receive, send, 413, too_large_message(self.max_body_bytes))
            return
        await self._limited(scope, receive, send)

    async def _limited(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app with a `receive` that refuses a body growing past the cap."""
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise BodyTooLarge(self.max_body_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if started:
                raise
            await self._refuse(scope, receive, send, 413, too_large_message(self.max_body_bytes))


def bearer_token(headers: Mapping[str, str]) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header, if any."""
    scheme, _, token = headers.get("authorization", "").strip().partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None
