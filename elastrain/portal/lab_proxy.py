"""``/clusters/<name>/lab/...``: the launcher container's JupyterLab, through the portal.

* ``POST /clusters/<name>/lab-session`` (form field ``token``: the cluster page's "Open JupyterLab"
  button posts the tab's API token into a new tab) sets the lab cookie for that cluster's lab paths
  and redirects to the lab;
* every HTTP method under the lab path is forwarded, bodies streamed both ways (httpx);
* WebSockets under it (kernels, terminals) are bridged message by message, both directions, with the
  browser's subprotocols offered upstream and the one chosen there accepted here (`websockets`).

Every request is authenticated and authorised again (`elastrain.portal.lab_access`); JupyterLab's own
token is added by the proxy alone. State-changing requests and WebSockets from another site's page
are refused (403): JupyterLab skips its XSRF checks for token-authenticated requests, so the proxy
makes them. No route here is part of the OpenAPI document.
"""

from __future__ import annotations

import asyncio
import contextlib
from urllib.parse import parse_qs

import httpx
from fastapi import APIRouter, FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import RedirectResponse, Response, StreamingResponse
from starlette.background import BackgroundTask
from starlette.types import Scope
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.typing import Origin, Subprotocol

from elastrain.backends.container_run import LabEndpoint
from elastrain.db.models import User
from elastrain.portal.lab_access import LabLocator, lab_user, not_answering, owned_launcher, refusal
from elastrain.portal.lab_http import (
    SAFE_METHODS,
    close_code,
    lab_path_ok,
    lab_prefix,
    request_headers,
    response_headers,
    same_origin,
    session_cookie,
    upstream_url,
    valid_token,
)
from elastrain.server.deps import ServicesDep, user_for_token
from elastrain.server.errors import ApiError, Conflict, Forbidden, NotFound, Unauthorized
from elastrain.server.redact import redact
from elastrain.server.services import Services
from elastrain.server.slots import UserSlots, lab_slots
from elastrain.server.tenant_limits import DEFAULT_LAB_MAX_MESSAGE_BYTES

METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"]
TIMEOUT = httpx.Timeout(connect=5.0, read=300.0, write=300.0, pool=10.0)
MAX_MESSAGE_BYTES = DEFAULT_LAB_MAX_MESSAGE_BYTES
"""Default cap of one WebSocket message from the lab (``--lab-max-message-bytes``); the browser's side
has uvicorn's cap (16 MiB). A larger message closes the socket (1009) instead of being buffered."""
UPSTREAM_QUEUE = 2  # messages read ahead from the lab while the browser is slow (each <= the cap)
CROSS_SITE = "refused a cross-site request to JupyterLab (its Origin is not this server)"


def _raw_path(scope: Scope) -> str:
    raw = scope.get("raw_path")
    return raw.decode("latin-1") if isinstance(raw, bytes) and raw else str(scope.get("path", ""))


def _query(scope: Scope) -> str:
    query = scope.get("query_string")
    return query.decode("latin-1") if isinstance(query, bytes) else ""


class LabProxy:
    """The proxy's state: the upstream HTTP client (made on first use) and the lab locator."""

    def __init__(self, max_message_bytes: int = MAX_MESSAGE_BYTES, sockets: UserSlots | None = None) -> None:
        self.locator = LabLocator()
        self.max_message_bytes = max_message_bytes
        self.sockets = sockets if sockets is not None else lab_slots()  # open WebSockets per user
        self._client: httpx.AsyncClient | None = None

    @property
    def client(self) -> httpx.AsyncClient:
        """The upstream client: no environment proxies (the launcher is on this machine's network)."""
        if self._client is None:
            self._client = httpx.AsyncClient(timeout=TIMEOUT, trust_env=False, follow_redirects=False)
        return self._client

    async def close(self) -> None:
        """Close the upstream client (server shutdown)."""
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def admit(
        self, services: Services, name: str, method: str, raw_path: str, headers: dict[str, str]
    ) -> tuple[User, LabEndpoint]:
        """The caller and the endpoint of their lab; an `ApiError` for anything refused."""
        user = await asyncio.to_thread(
            lab_user, services, headers.get("authorization"), headers.get("cookie")
        )
        if not lab_path_ok(name, raw_path):
            raise NotFound(f"no such path under {lab_prefix(name)}")
        if method not in SAFE_METHODS and not same_origin(headers.get("origin"), headers.get("host")):
            raise Forbidden(CROSS_SITE)
        return user, await asyncio.to_thread(self.locator.locate, services, user, name)

    async def forward(self, services: Services, request: Request, name: str) -> Response:
        """One HTTP request to the lab and its answer, bodies streamed."""
        raw_path = _raw_path(request.scope)
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            _user, endpoint = await self.admit(services, name, request.method, raw_path, headers)
        except ApiError as exc:
            return refusal(exc, raw_path, name, headers.get("accept", ""))
        has_body = "transfer-encoding" in headers or headers.get("content-length", "0") not in ("", "0")
        upstream_request = self.client.build_request(
            request.method,
            upstream_url(endpoint.origin, raw_path, _query(request.scope)),
            headers=request_headers(request.headers.items(), endpoint.token, endpoint.origin),
            content=request.stream() if has_body else None,
        )
        try:
            upstream = await self.client.send(upstream_request, stream=True)
        except httpx.TransportError:
            self.locator.forget(name)
            return refusal(not_answering(name), raw_path, name, headers.get("accept", ""))
        response = StreamingResponse(
            upstream.aiter_raw(), status_code=upstream.status_code, background=BackgroundTask(upstream.aclose)
        )
        response.raw_headers = [
            (k.encode("latin-1"), v.encode("latin-1"))
            for k, v in response_headers(upstream.headers.multi_items(), endpoint.origin)
        ]
        return response

    async def connect_upstream(
        self, url: str, origin: str, offered: list[Subprotocol], headers: list[tuple[str, str]]
    ) -> ClientConnection:
        """The WebSocket to the lab: messages capped at `max_message_bytes` (a larger one closes it
        with 1009 without being kept), at most `UPSTREAM_QUEUE` read ahead of the browser."""
        return await connect(
            url,
            origin=Origin(origin),
            subprotocols=offered or None,
            additional_headers=headers,
            user_agent_header=None,
            max_size=self.max_message_bytes,
            max_queue=UPSTREAM_QUEUE,
            open_timeout=10,
        )

    async def bridge(self, services: Services, websocket: WebSocket, name: str) -> None:
        """A WebSocket to the lab: admitted like HTTP (and same-origin always), then both directions
        pumped until either side closes; a refusal is an HTTP answer to the handshake."""
        raw_path = _raw_path(websocket.scope)
        headers = {k.lower(): v for k, v in websocket.headers.items()}
        try:
            user, endpoint = await self.admit(services, name, "WEBSOCKET", raw_path, headers)
            release = self.sockets.open(user)  # 429 past --max-lab-sockets
        except ApiError as exc:
            await _deny(websocket, exc.status, redact(str(exc)))
            return
        try:
            await self._bridge(websocket, name, raw_path, endpoint)
        finally:
            release()

    async def _bridge(self, websocket: WebSocket, name: str, raw_path: str, endpoint: LabEndpoint) -> None:
        offered = [Subprotocol(p) for p in websocket.scope.get("subprotocols") or []]
        try:
            upstream = await self.connect_upstream(
                upstream_url(endpoint.origin, raw_path, _query(websocket.scope), websocket=True),
                endpoint.origin,
                offered,
                request_headers(websocket.headers.items(), endpoint.token, endpoint.origin, websocket=True),
            )
        except InvalidStatus as exc:  # JupyterLab refused (e.g. 404: no such kernel or terminal)
            await _deny(websocket, exc.response.status_code, "JupyterLab refused the WebSocket")
            return
        except (OSError, TimeoutError, InvalidHandshake):
            self.locator.forget(name)
            await _deny(websocket, 503, str(not_answering(name)))
            return
        async with upstream:
            await websocket.accept(subprotocol=upstream.subprotocol)
            await _pump(websocket, upstream)


async def _deny(websocket: WebSocket, status: int, detail: str) -> None:
    """Refuse a WebSocket handshake with an HTTP status (where the ASGI server can), else a close."""
    if "websocket.http.response" in websocket.scope.get("extensions", {}):
        await websocket.send_denial_response(Response(detail, status_code=status, media_type="text/plain"))
    else:
        await websocket.close(code=4000 + status, reason=detail[:120])


async def _pump(websocket: WebSocket, upstream: ClientConnection) -> None:
    """Messages both ways (text stays text, binary stays binary) until one side closes; the close
    code crosses to the other side."""

    async def from_browser() -> None:
        while True:
            message = await websocket.receive()
            if message["type"] == "websocket.disconnect":
                await upstream.close(close_code(message.get("code")))
                return
            if message.get("text") is not None:
                await upstream.send(message["text"])
            elif message.get("bytes") is not None:
                await upstream.send(message["bytes"])

    async def from_lab() -> None:
        with contextlib.suppress(ConnectionClosed):
            async for data in upstream:
                if isinstance(data, str):
                    await websocket.send_text(data)
                else:
                    await websocket.send_bytes(data)
        with contextlib.suppress(RuntimeError, OSError, WebSocketDisconnect):  # the browser may be gone
            await websocket.close(close_code(upstream.close_code))

    tasks = [asyncio.create_task(from_browser()), asyncio.create_task(from_lab())]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def add_lab_proxy(app: FastAPI) -> None:
    """Register the lab session route, the HTTP proxy and the WebSocket bridge under
    ``/clusters/{name}/lab/``; the services come from ``app.state`` on the first request, the bounds
    from ``app.state.settings`` now (defaults without)."""
    settings = getattr(app.state, "settings", None)
    if settings is None:
        proxy = LabProxy()
    else:
        proxy = LabProxy(settings.lab_max_message_bytes, lab_slots(settings.max_lab_sockets))
    app.router.on_shutdown.append(proxy.close)
    router = APIRouter(include_in_schema=False)

    @router.post("/clusters/{name}/lab-session")
    async def lab_session(request: Request, name: str, services: ServicesDep) -> Response:
        """The cluster page's "Open JupyterLab": the form's token becomes the lab cookie."""
        accept = request.headers.get("accept", "")
        form = parse_qs((await request.body()).decode("utf-8", errors="replace"))
        token = (form.get("token") or [""])[0].strip()
        try:
            if not same_origin(request.headers.get("origin"), request.headers.get("host")):
                raise Forbidden(CROSS_SITE)
            if not valid_token(token):
                raise Unauthorized("sign in to the portal first, then open JupyterLab from the cluster page")
            user = await asyncio.to_thread(user_for_token, services, token)
            try:
                await asyncio.to_thread(owned_launcher, services, user, name)
            except Conflict:
                pass  # the lab's own page says so (and the cookie works once the launcher runs)
        except ApiError as exc:
            return refusal(exc, request.url.path, name, accept)
        response = RedirectResponse(lab_prefix(name), status_code=303)
        response.headers.append("set-cookie", session_cookie(name, token, request.url.scheme == "https"))
        response.headers["Cache-Control"] = "no-store"
        return response

    @router.api_route("/clusters/{name}/lab", methods=METHODS)
    async def lab_root(request: Request, name: str) -> Response:
        query = _query(request.scope)
        return RedirectResponse(lab_prefix(name) + (f"?{query}" if query else ""), status_code=307)

    @router.api_route("/clusters/{name}/lab/{path:path}", methods=METHODS)
    async def lab_http(request: Request, name: str, path: str, services: ServicesDep) -> Response:
        return await proxy.forward(services, request, name)

    @router.websocket("/clusters/{name}/lab/{path:path}")
    async def lab_websocket(websocket: WebSocket, name: str, path: str, services: ServicesDep) -> None:
        await proxy.bridge(services, websocket, name)

    app.include_router(router)
