"""Issue 29 item 3: one huge WebSocket message from a tenant's JupyterLab cannot fill the portal.

The attack: a tenant's own server on the launcher's lab port sends one 200 MB WebSocket message
through the portal's lab proxy (it cost the server 400-600 MiB and stalled its event loop). The
proxy's upstream connection now takes messages up to ``--lab-max-message-bytes`` only: a larger one
closes the socket (1009) as soon as the cap is passed, and the rest is discarded as it arrives.
"""

from __future__ import annotations

import asyncio
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from elastrain.portal.lab_proxy import LabProxy
from elastrain.testing.ports import free_port
from tests.security.test_terminal_writes import run_in_own_thread

pytestmark = pytest.mark.timeout(60)
MIB = 1 << 20
BOMB = 200 * MIB
CAP = 4 * MIB


@pytest.mark.attack("29.lab-message")
def test_a_200_mb_message_from_the_lab_closes_the_socket_unread() -> None:
    sent = 0

    async def bomb(connection: ServerConnection) -> None:
        nonlocal sent

        async def fragments() -> AsyncIterator[bytes]:  # streamed: the sender holds 1 MiB at a time
            nonlocal sent
            for _ in range(BOMB // MIB):
                yield b"x" * MIB
                sent += MIB

        try:
            await connection.send(fragments())
            await connection.send("after the bomb")
        except ConnectionClosed:
            pass

    async def main() -> None:
        port = free_port()
        tracemalloc.start()
        async with serve(bomb, "127.0.0.1", port, max_size=None):
            proxy = LabProxy(max_message_bytes=CAP)
            upstream = await proxy.connect_upstream(f"ws://127.0.0.1:{port}/", "http://127.0.0.1", [], [])
            with pytest.raises(ConnectionClosed) as closed:
                await asyncio.wait_for(upstream.recv(), 30)
            assert closed.value.sent is not None and closed.value.sent.code == 1009  # message too big
            await upstream.close()
        _now, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        # this process held the sender's 1 MiB fragments and what the proxy kept: never the message
        assert peak < 32 * MIB, f"peak {peak // MIB} MiB allocated while {sent // MIB} MiB were sent"

    run_in_own_thread(main())


def test_messages_under_the_cap_cross() -> None:
    async def echo(connection: ServerConnection) -> None:
        await connection.send("y" * (CAP - 1024))

    async def main() -> None:
        port = free_port()
        async with serve(echo, "127.0.0.1", port):
            proxy = LabProxy(max_message_bytes=CAP)
            upstream = await proxy.connect_upstream(f"ws://127.0.0.1:{port}/", "http://127.0.0.1", [], [])
            assert len(await asyncio.wait_for(upstream.recv(), 30)) == CAP - 1024
            await upstream.close()

    run_in_own_thread(main())
