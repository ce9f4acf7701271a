"""The pure rules of the JupyterLab proxy: where a request goes, which headers cross, what is refused.

The proxy (`elastrain.portal.lab_proxy`) forwards ``/clusters/<name>/lab/...`` unchanged to the
launcher's JupyterLab (which serves under that same base URL). Upstream it replaces the portal's
credentials (the bearer token or the `LAB_COOKIE`) with JupyterLab's own token and presents the
upstream origin; the hop-by-hop headers of either side never cross (RFC 9110 section 7.6.1).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

LAB_COOKIE = "elastrain_lab"
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)
# replaced upstream (the portal's credentials, the client's view of host and origin)
_REPLACED = frozenset({"host", "authorization", "cookie", "origin"})
# the WebSocket client makes its own handshake; the browser's handshake headers stay here
_WEBSOCKET_OWN = frozenset(
    {"sec-websocket-key", "sec-websocket-version", "sec-websocket-extensions", "sec-websocket-protocol"}
)
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9._~-]{1,512}$")  # what a cookie value may hold unquoted
# close codes a WebSocket endpoint may send (RFC 6455 section 7.4; 1005/1006/1015 are reserved)
_SENDABLE_CLOSE = frozenset({1000, 1001, 1002, 1003, 1007, 1008, 1009, 1010, 1011, 1012, 1013, 1014})


def lab_prefix(cluster: str) -> str:
    """The portal path of `cluster`'s JupyterLab (also its ``base_url``)."""
    return f"/clusters/{cluster}/lab/"


def lab_path_ok(cluster: str, raw_path: str) -> bool:
    """`raw_path` (as sent, percent-encoded) lies under the cluster's lab prefix, with no dot segment."""
    if not raw_path.startswith(lab_prefix(cluster)):
        return False
    segments = raw_path[len(lab_prefix(cluster)) :].split("/")
    return not any(s.lower() in (".", "..", "%2e", "%2e%2e", ".%2e", "%2e.") for s in segments)


def upstream_url(origin: str, raw_path: str, query: str, websocket: bool = False) -> str:
    """The URL on JupyterLab (`origin` is ``http://host:port``) of a request for `raw_path`?`query`."""
    base = "ws://" + origin.removeprefix("http://") if websocket else origin
    return f"{base}{raw_path}" + (f"?{query}" if query else "")


def connection_named(headers: Iterable[tuple[str, str]]) -> set[str]:
    """Header names the ``Connection`` header lists (hop-by-hop too, RFC 9110 section 7.6.1)."""
    return {
        name.strip().lower()
        for key, value in headers
        if key.lower() == "connection"
        for name in value.split(",")
        if name.strip()
    }


def cookie_value(header: str | None, name: str) -> str | None:
    """The value of cookie `name` in a ``Cookie`` header, if present."""
    for pair in (header or "").split(";"):
        key, sep, value = pair.strip().partition("=")
        if sep and key == name:
            return value.strip().strip('"')
    return None


def without_cookie(header: str, name: str) -> str:
    """A ``Cookie`` header minus cookie `name` ("" when nothing is left)."""
    kept = [p.strip() for p in header.split(";") if p.strip() and p.strip().partition("=")[0] != name]
    return "; ".join(kept)


def request_headers(
    headers: Iterable[tuple[str, str]], token: str, origin: str, websocket: bool = False
) -> list[tuple[str, str]]:
    """The headers of the upstream request: the client's minus hop-by-hop ones and the portal's
    credentials, plus JupyterLab's token; an ``Origin`` is replaced by the upstream's own (the proxy
    has checked the client's: `same_origin`)."""
    headers = list(headers)
    drop = HOP_BY_HOP | connection_named(headers) | _REPLACED | (_WEBSOCKET_OWN if websocket else set())
    out = [(k, v) for k, v in headers if k.lower() not in drop]
    if websocket:  # the client library sets its own agent; only the cookies matter to JupyterLab
        out = [(k, v) for k, v in out if k.lower() not in ("user-agent", "content-length")]
    cookies = "; ".join(without_cookie(v, LAB_COOKIE) for k, v in headers if k.lower() == "cookie")
    if cookies.strip("; "):
        out.append(("cookie", cookies))
    if not websocket and any(k.lower() == "origin" for k, _ in headers):
        out.append(("origin", origin))
    out.append(("authorization", f"token {token}"))
    return out


def response_headers(headers: Iterable[tuple[str, str]], origin: str) -> list[tuple[str, str]]:
    """The headers of JupyterLab's answer as the browser gets them: no hop-by-hop ones, no CORS grants
    (the lab is same-origin only), and a ``Location`` on the upstream origin made a path."""
    headers = list(headers)
    drop = HOP_BY_HOP | connection_named(headers)
    out = []
    for key, value in headers:
        lower = key.lower()
        if lower in drop or lower.startswith("access-control-allow-"):
            continue
        if lower == "location" and value.startswith(origin + "/"):
            value = value[len(origin) :]
        out.append((key, value))
    return out


def same_origin(origin: str | None, host: str | None) -> bool:
    """A request with no ``Origin`` (not a browser's cross-site one), or one from this host."""
    if origin is None:
        return True
    return bool(host) and urlsplit(origin).netloc.lower() == (host or "").lower()


def valid_token(token: str) -> bool:
    """`token` can be a cookie value as it is (API tokens are URL-safe)."""
    return bool(_TOKEN_CHARS.match(token))


def session_cookie(cluster: str, token: str, secure: bool) -> str:
    """The ``Set-Cookie`` value that carries the portal's token to the cluster's lab paths only:
    invisible to scripts (HttpOnly) and never sent by another site's page (SameSite=Strict)."""
    cookie = f"{LAB_COOKIE}={token}; Path={lab_prefix(cluster)}; HttpOnly; SameSite=Strict"
    return cookie + ("; Secure" if secure else "")


def close_code(code: int | None) -> int:
    """A close code that may be sent on: a reserved or missing one becomes 1000 (normal closure)."""
    if code is not None and (code in _SENDABLE_CLOSE or 3000 <= code <= 4999):
        return code
    return 1000
