"""Issue 29 item 3: a portal terminal whose tab stops reading cannot grow the server's memory.

The attack: a WebSocket client keeps the terminal open, starts a command that writes without end,
and stops reading its socket. Each tab's output queue is bounded; once it is full the server stops
reading the pty (the shell blocks on its writes) instead of buffering without bound.
"""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import pytest
from websockets.client import ClientProtocol
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.uri import parse_uri

from elastrain.testing.clusters import all_running
from elastrain.testing.waits import wait_until
from tests.security.harness import start_server

pytestmark = pytest.mark.timeout(180)
STALL_S = 15
GROWTH_BOUND_KIB = 64 * 1024  # was ~550 MB in 90 s before the bound (188 -> 740 MB)


class RawTab:
    """A terminal tab on a plain socket: it reads only when told to (a library client keeps reading
    in a thread of its own), so "stops reading" means exactly that."""

    def __init__(self, url: str) -> None:
        where = parse_uri(url)
        self.protocol = ClientProtocol(where, max_size=None)
        self.protocol.send_request(self.protocol.connect())
        self.sock = socket.create_connection((where.host, where.port), timeout=10)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        self._flush()
        while self.protocol.state is State.CONNECTING:
            self.protocol.receive_data(self.sock.recv(65536))
        assert self.protocol.state is State.OPEN, self.protocol.handshake_exc
        self.seen = ""

    def _flush(self) -> None:
        for chunk in self.protocol.data_to_send():
            if chunk:
                self.sock.sendall(chunk)

    def send(self, message: dict[str, object]) -> None:
        """Send one JSON message."""
        self.protocol.send_text(json.dumps(message).encode())
        self._flush()

    def shows(self, text: str) -> bool:
        """Read once from the socket; whether the latest output holds `text`."""
        self.protocol.receive_data(self.sock.recv(65536))
        for event in self.protocol.events_received():
            if isinstance(event, Frame) and event.opcode is Opcode.TEXT:
                self.seen = (self.seen + event.data.decode())[-1000:]
        self._flush()  # pongs
        return text in self.seen

    def close(self) -> None:
        """Drop the connection."""
        self.sock.close()


@pytest.mark.attack("29.terminal-stall")
def test_a_terminal_that_stops_reading_does_not_grow_server_memory(
    tmp_path: Path, security_figures: list[str]
) -> None:
    with start_server(tmp_path, ("--insecure-host-commands",)) as server:
        with server.client() as admin:
            admin.create_cluster("flood", containers=2)
            admin.wait_cluster("flood", all_running)
        tab = RawTab(server.url.replace("http://", "ws://") + "/api/v1/clusters/flood/terminal")
        try:
            tab.send({"token": server.token})
            tab.send({"input": "yes flood-$((6*7))-" + "0123456789abcdef" * 8 + "\n"})
            wait_until(lambda: tab.shows("flood-42-0123"), 20, "the flood to start")
            before = server.rss_kib()
            time.sleep(STALL_S)  # the attack itself: the tab stays open and reads nothing
            grown = server.rss_kib() - before
            security_figures.append(
                f"terminal not read for {STALL_S} s while `yes` floods it: server RSS +{grown / 1024:.1f} MiB"
            )
            with server.http() as api:
                assert api.get("/healthz").status_code == 200
            assert grown < GROWTH_BOUND_KIB, f"server RSS grew {grown} KiB while the tab did not read"
            tab.send({"input": "\x03"})  # Ctrl-C; the tab reads again and the shell answers
            tab.send({"input": "echo done-$((6*7))\n"})
            wait_until(lambda: tab.shows("done-42"), 60, "the shell to answer again")
        finally:
            tab.close()


@pytest.mark.attack
def test_terminal_connections_beyond_the_cap_are_closed(tmp_path: Path) -> None:
    from websockets.exceptions import ConnectionClosed
    from websockets.sync.client import connect

    with start_server(tmp_path, ("--insecure-host-commands", "--max-terminals", "2")) as server:
        with server.client() as admin:
            admin.create_cluster("tabs", containers=2)
            admin.wait_cluster("tabs", all_running)
        url = server.url.replace("http://", "ws://") + "/api/v1/clusters/tabs/terminal"
        with connect(url) as first, connect(url) as second:
            for tab in (first, second):
                tab.send(json.dumps({"token": server.token}))
                tab.send(json.dumps({"input": "echo open-$((6*7))\n"}))
                wait_until(lambda tab=tab: "open-42" in str(tab.recv(timeout=10)), 20, "the tab to answer")
            with connect(url) as third:
                third.send(json.dumps({"token": server.token}))
                with pytest.raises(ConnectionClosed) as closed:
                    while True:
                        third.recv(timeout=10)
                assert closed.value.rcvd is not None and closed.value.rcvd.code == 4429
                assert "--max-terminals" in closed.value.rcvd.reason
        with connect(url) as again:  # the first two are closed: a place is free again
            again.send(json.dumps({"token": server.token}))
            again.send(json.dumps({"input": "echo back-$((6*7))\n"}))
            wait_until(lambda: "back-42" in str(again.recv(timeout=10)), 20, "a tab after the others closed")
