"""A shell on a pseudo-terminal in a container's root, bridged to a WebSocket; it survives the tab."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import json
import os
import select
import shutil
import signal
import struct
import subprocess
import termios
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.backends.procs import TENANT_NICE, server_first_path
from elastrain.backends.shm import with_shm_limit

if TYPE_CHECKING:
    from fastapi import WebSocket

READ_CHUNK = 65536
SCROLLBACK_BYTES = 256 * 1024  # replayed to a tab that (re)connects
INPUT_BUFFER_BYTES = 256 * 1024  # typed/pasted input not yet taken by the shell, per terminal
OUTPUT_QUEUE_BYTES = 256 * 1024  # output read from the pty but not yet sent to the tab, per terminal


def set_nonblocking(fd: int) -> None:
    """Put `fd` in non-blocking mode (a write that would block raises instead of waiting)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_NONBLOCK)


class PtyWriter:
    """Writes input to a non-blocking fd from the event loop without ever blocking it.

    What the fd does not take at once is buffered and written when the loop reports the fd writable
    (``loop.add_writer``). The buffer is bounded: `write` waits while it holds more than `limit`
    bytes, so a caller reading a WebSocket stops reading it (backpressure on that socket only; every
    other request is served meanwhile). After the fd fails (the shell is gone) input is dropped.
    """

    def __init__(self, fd: int, limit: int = INPUT_BUFFER_BYTES) -> None:
        self.fd = fd
        self.limit = limit
        self._buffer = bytearray()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watching = False
        self._room = asyncio.Event()
        self._room.set()
        self.failed = False

    @property
    def buffered(self) -> int:
        """Bytes accepted but not yet written."""
        return len(self._buffer)

    async def write(self, data: bytes) -> None:
        """Queue `data`; returns once the buffer is back under the limit (never blocks the loop)."""
        if self.failed or not data:
            return
        self._loop = asyncio.get_running_loop()
        self._buffer += data
        self._flush()
        while len(self._buffer) > self.limit and not self.failed:
            self._room.clear()
            await self._room.wait()

    def _flush(self) -> None:
        while self._buffer:
            try:
                written = os.write(self.fd, self._buffer[:READ_CHUNK])
            except BlockingIOError:
                break
            except InterruptedError:
                continue
            except OSError:  # EIO/EBADF: the shell is gone; drop what it will never read
                self.failed = True
                self._buffer.clear()
                break
            del self._buffer[:written]
        if self._buffer and not self._watching and self._loop is not None:
            self._loop.add_writer(self.fd, self._flush)
            self._watching = True
        elif not self._buffer and self._watching:
            self._stop_watching()
        if len(self._buffer) <= self.limit:
            self._room.set()

    def _stop_watching(self) -> None:
        if self._watching and self._loop is not None:
            with contextlib.suppress(Exception):  # the loop is closing or the fd already gone
                self._loop.remove_writer(self.fd)
        self._watching = False

    def close(self) -> None:
        """Stop writing (the tab went away or the shell exited); unblock a waiting `write`."""
        self._stop_watching()
        self._buffer.clear()
        self.failed = True
        self._room.set()


@dataclass(frozen=True)
class TerminalTarget:
    """Where a shell runs: working directory, extra environment and a label for logs."""

    cwd: Path
    env: dict[str, str]
    label: str
    shm_bytes: int = 0  # the container's /dev/shm size (enforced where the OS allows)
    # a real container: argv of a shell inside it, given the shell's extra environment
    argv_for: Callable[[dict[str, str]], list[str] | None] | None = None


def _shell() -> list[str]:
    for candidate in ("bash", "sh"):
        found = shutil.which(candidate)
        if found:
            return [found, "-i"] if candidate == "sh" else [found, "--noprofile", "--norc", "-i"]
    raise FileNotFoundError("no shell (bash or sh) found")


def _set_size(fd: int, cols: int, rows: int) -> None:
    cols, rows = max(2, min(int(cols), 1000)), max(2, min(int(rows), 1000))
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def _make_controlling_tty() -> None:  # runs in the child between fork and exec
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)
    os.nice(TENANT_NICE)  # a tenant's shell: below the server, as every tenant process (procs.niced)


class TerminalSession:
    """A shell process on a pty that outlives the browser tab, as JupyterLab's terminals do.

    A reader thread drains the pty into a bounded scrollback buffer while no tab is attached (so a
    job writing to it never blocks then); `bridge` replays that buffer to a WebSocket, then streams.
    While a tab is attached, output waits in a queue bounded by `output_limit` bytes: when a tab
    does not read (its socket is full), the queue fills and the reader thread stops reading the pty
    until it drains, so the shell blocks on its writes (the kernel's pty buffer is the rest of the
    bound) and the server's memory does not grow.
    """

    def __init__(
        self, proc: subprocess.Popen[bytes], master: int, output_limit: int = OUTPUT_QUEUE_BYTES
    ) -> None:
        self.proc = proc
        self.master = master
        self.output_limit = output_limit
        set_nonblocking(master)  # input is written from the event loop: it must never block there
        self._lock = threading.Lock()
        self._drained = threading.Condition(self._lock)  # the tab's queue went under the limit
        self._closing = False
        self._queued = 0  # bytes handed to the attached tab's queue and not yet taken by it
        self._scrollback = bytearray()
        self._subscriber: tuple[asyncio.AbstractEventLoop, asyncio.Queue[bytes]] | None = None
        self.exited = threading.Event()
        threading.Thread(target=self._read, name="terminal-reader", daemon=True).start()

    @classmethod
    def start(cls, target: TerminalTarget, size: list[object] | None = None) -> TerminalSession:
        """Spawn the shell in `target.cwd` with the container's environment (the venv's tools first)."""
        master, slave = os.openpty()
        try:
            if size and len(size) == 2:
                with contextlib.suppress(TypeError, ValueError):
                    _set_size(master, int(str(size[0])), int(str(size[1])))
            env = {**os.environ, **target.env, "TERM": "xterm-256color", "HOME": str(target.cwd)}
            env["PS1"] = f"[{target.label}] \\W$ "
            env["PATH"] = server_first_path(env.get("PATH", ""))
            argv = target.argv_for(target.env) if target.argv_for is not None else None
            proc = subprocess.Popen(
                argv or with_shm_limit(_shell(), target.shm_bytes),
                cwd=target.cwd,
                env=env,
                stdin=slave,
                stdout=slave,
                stderr=slave,
                start_new_session=True,
                preexec_fn=_make_controlling_tty,  # the shell needs a controlling tty (job control)
                close_fds=True,
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        return cls(proc, master)

    @property
    def alive(self) -> bool:
        """The shell has not exited."""
        return not self.exited.is_set() and self.proc.poll() is None

    @property
    def queued(self) -> int:
        """Output bytes waiting for the attached tab (at most `output_limit` plus one read)."""
        return self._queued

    def _wait_for_room(self) -> None:
        """Block the reader thread while the attached tab's queue is full (backpressure to the pty)."""
        with self._lock:
            while not self._closing and self._subscriber is not None and self._queued >= self.output_limit:
                self._drained.wait(1.0)

    def _taken(self, queue: asyncio.Queue[bytes], size: int) -> None:
        """The tab took `size` bytes from its `queue`: wake the reader if that made room."""
        with self._lock:
            if self._subscriber is not None and self._subscriber[1] is queue:
                self._queued = max(0, self._queued - size)
                self._drained.notify_all()

    def _read(self) -> None:
        while True:
            self._wait_for_room()
            try:
                data = os.read(self.master, READ_CHUNK)
            except BlockingIOError:  # the fd is non-blocking (for the writer): wait until readable
                with contextlib.suppress(OSError, ValueError):
                    select.select([self.master], [], [], 1.0)
                continue
            except InterruptedError:
                continue
            except OSError:  # EIO: the shell and everything on its tty are gone
                data = b""
            with self._lock:
                if data:
                    self._scrollback += data
                    del self._scrollback[:-SCROLLBACK_BYTES]
                else:
                    self.exited.set()
                subscriber = self._subscriber
                if subscriber is not None:
                    self._queued += len(data)
            if subscriber is not None:
                loop, queue = subscriber
                with contextlib.suppress(RuntimeError):  # the tab's loop is closing
                    loop.call_soon_threadsafe(queue.put_nowait, data)
            if not data:
                return

    def resize(self, cols: object, rows: object) -> None:
        """Set the pty's window size."""
        with contextlib.suppress(TypeError, ValueError, OSError):
            _set_size(self.master, int(str(cols)), int(str(rows)))

    async def bridge(self, websocket: WebSocket) -> None:
        """Replay the scrollback, then pump output to the socket and input to the shell; returns when
        the shell exits or the browser disconnects (the shell keeps running then)."""
        queue: asyncio.Queue[bytes] = asyncio.Queue()
        with self._lock:
            backlog = bytes(self._scrollback)
            self._subscriber = (asyncio.get_running_loop(), queue)
            self._queued = 0
            self._drained.notify_all()
            if self.exited.is_set():
                queue.put_nowait(b"")

        async def pump_out() -> None:
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            if backlog:
                await websocket.send_text(decoder.decode(backlog))
            while True:
                data = await queue.get()
                self._taken(queue, len(data))
                if not data:
                    await websocket.close(code=1000, reason="shell exited")
                    return
                text = decoder.decode(data)
                if text:
                    await websocket.send_text(text)

        writer = PtyWriter(self.master)

        async def pump_in() -> None:
            while True:
                message = json.loads(await websocket.receive_text())
                if isinstance(message.get("input"), str):
                    # waits (not reading this socket) while the shell is behind; the loop runs on
                    await writer.write(message["input"].encode())
                size = message.get("resize")
                if isinstance(size, list) and len(size) == 2:
                    self.resize(size[0], size[1])

        tasks = [asyncio.create_task(pump_out()), asyncio.create_task(pump_in())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            with self._lock:
                if self._subscriber is not None and self._subscriber[1] is queue:
                    self._subscriber = None
                    self._queued = 0
                    self._drained.notify_all()  # no tab: the reader drains into the scrollback again
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            writer.close()

    def close(self) -> None:
        """Hang up: stop the shell's whole process group and close the pty."""
        with self._lock:
            self._closing = True  # a reader held back by a full tab queue reads (EIO) and ends
            self._drained.notify_all()
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGHUP)
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        self.exited.wait(2)
        with contextlib.suppress(OSError):
            os.close(self.master)


class TerminalRegistry:
    """One persistent shell per (user, cluster): a reconnecting tab gets the same shell back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[tuple[int, str], TerminalSession] = {}

    def get_or_start(
        self, key: tuple[int, str], start: Callable[[], TerminalSession]
    ) -> tuple[TerminalSession, bool]:
        """The live session of `key`, or a new one from `start`; True when it was started now."""
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.alive:
                return session, False
            if session is not None:
                session.close()
            session = self._sessions[key] = start()
            return session, True

    def close_all(self) -> None:
        """Hang up every shell (server shutdown)."""
        with self._lock:
            sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            session.close()
