"""Issue 14 item 2: terminal input never blocks the event loop; a full shell gets backpressure."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Coroutine
from typing import Any

import pytest

from elastrain.portal.terminal import PtyWriter, set_nonblocking

MB = 1 << 20
CHUNK = 16 * 1024


def run_in_own_thread(coro: Coroutine[Any, Any, None]) -> None:
    """`asyncio.run` in a thread of its own: an earlier test of the session may have left an event
    loop running in this one (asyncio.run refuses to start there)."""
    errors: list[BaseException] = []

    def target() -> None:
        try:
            asyncio.run(coro)
        except BaseException as exc:  # handed to the test's thread
            errors.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    thread.join(timeout=60)
    assert not thread.is_alive(), "the test's event loop did not finish within 60 s"
    if errors:
        raise errors[0]


async def ticker(stop: asyncio.Event) -> float:
    """Tick every 10 ms until `stop`; the longest gap between ticks."""
    worst, last = 0.0, time.monotonic()
    while not stop.is_set():
        await asyncio.sleep(0.01)
        now = time.monotonic()
        worst, last = max(worst, now - last), now
    return worst


@pytest.mark.attack
def test_writing_1mb_to_a_pipe_nobody_reads_keeps_the_loop_responsive() -> None:
    async def main() -> None:
        read_fd, write_fd = os.pipe()
        set_nonblocking(write_fd)
        writer = PtyWriter(write_fd, limit=64 * 1024)
        stop = asyncio.Event()
        ticks = asyncio.create_task(ticker(stop))
        sent = 0

        async def paste() -> None:
            nonlocal sent
            for _ in range(MB // CHUNK):
                await writer.write(b"x" * CHUNK)
                sent += CHUNK

        pasting = asyncio.create_task(paste())
        await asyncio.sleep(1.0)
        assert not pasting.done()  # backpressure: the paste waits, it does not pile up in memory
        assert writer.buffered <= 64 * 1024 + CHUNK
        assert sent < MB
        writer.close()  # the tab goes away: a waiting write returns
        await asyncio.wait_for(pasting, 2)
        stop.set()
        assert await ticks < 0.2
        os.close(read_fd)
        os.close(write_fd)

    run_in_own_thread(main())


def test_everything_arrives_in_order_when_the_reader_is_slow() -> None:
    async def main() -> None:
        read_fd, write_fd = os.pipe()
        set_nonblocking(write_fd)
        writer = PtyWriter(write_fd, limit=64 * 1024)
        payload = bytes(range(256)) * (MB // 256)
        received = bytearray()
        loop = asyncio.get_running_loop()

        def drain() -> None:  # a slow shell: reads in another thread, in small bites
            while len(received) < len(payload):
                received.extend(os.read(read_fd, 4096))

        reading = loop.run_in_executor(None, drain)
        stop = asyncio.Event()
        ticks = asyncio.create_task(ticker(stop))
        for i in range(0, len(payload), CHUNK):
            await writer.write(payload[i : i + CHUNK])
        await asyncio.wait_for(reading, 15)
        stop.set()
        assert bytes(received) == payload
        assert writer.buffered == 0
        assert await ticks < 0.2
        writer.close()
        os.close(read_fd)
        os.close(write_fd)

    run_in_own_thread(main())


def test_a_dead_shell_drops_input_instead_of_failing() -> None:
    async def main() -> None:
        read_fd, write_fd = os.pipe()
        set_nonblocking(write_fd)
        os.close(read_fd)  # nobody will ever read: EPIPE
        writer = PtyWriter(write_fd)
        await writer.write(b"echo hi\n")
        assert writer.failed and writer.buffered == 0
        os.close(write_fd)

    run_in_own_thread(main())
