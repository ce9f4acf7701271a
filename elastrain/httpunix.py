"""``urlopen`` that also speaks HTTP over a Unix socket: ``http+unix://<quoted socket path>/path``.

Jobs in containers reach the control plane through a Unix socket the server bind-mounts into each
container (``http+unix://%2Frun%2Felastrain%2Fapi.sock``), so reports never depend on the container
network (see `elastrain.backends.gateway`). Plain ``http://`` URLs go through `urllib` as before.
"""

from __future__ import annotations

import http.client
import socket
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

SCHEME = "http+unix"


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, socket_path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.socket_path = socket_path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self.socket_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class _UnixHandler(urllib.request.BaseHandler):
    """Opens ``http+unix://`` requests (registered under that scheme's name below)."""

    def open_unix(self, request: urllib.request.Request) -> http.client.HTTPResponse:
        parsed = urllib.parse.urlsplit(request.full_url)
        timeout = getattr(request, "timeout", None)
        conn = _UnixConnection(urllib.parse.unquote(parsed.netloc), timeout if timeout else 10.0)
        path = (parsed.path or "/") + (f"?{parsed.query}" if parsed.query else "")
        headers = {**request.unredirected_hdrs, **request.headers, "Host": "localhost", "Connection": "close"}
        try:
            conn.request(request.get_method(), path, body=request.data, headers=headers)
            response = conn.getresponse()
        except OSError as exc:
            conn.close()
            raise urllib.error.URLError(exc) from exc
        if response.status >= 400:  # as urllib does for http://
            raise urllib.error.HTTPError(
                request.full_url, response.status, response.reason, response.headers, response
            )
        return response


setattr(_UnixHandler, f"{SCHEME}_open", _UnixHandler.open_unix)  # urllib finds handlers by method name


def unix_url(socket_path: str) -> str:
    """The base URL of the HTTP server on `socket_path`."""
    return f"{SCHEME}://{urllib.parse.quote(socket_path, safe='')}"


def urlopen(request: urllib.request.Request, timeout: float) -> Any:
    """`urllib.request.urlopen`, plus ``http+unix://`` URLs (HTTP errors raise `HTTPError` as usual)."""
    if request.type != SCHEME:
        return urllib.request.urlopen(request, timeout=timeout)
    request.timeout = timeout
    opener = urllib.request.build_opener(_UnixHandler())
    return opener.open(request, timeout=timeout)
