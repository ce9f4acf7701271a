"""A login shell on a pseudo-terminal in a container's root, bridged to a WebSocket."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import fcntl
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import termios
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastapi import WebSocket

READ_CHUNK = 65536


@dataclass(frozen=True)
class TerminalTarget:
    """Where a shell runs: working directory, extra environment and a label for logs."""

    cwd: Path
    env: dict[str, str]
    label: str


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


class TerminalSession:
    """A shell process on a pty; `bridge` copies bytes between it and a WebSocket until either ends."""

    def __init__(self, proc: subprocess.Popen[bytes], master: int) -> None:
        self.proc = proc
        self.master = master

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
            bin_dir = str(Path(sys.executable).parent)
            env["PATH"] = os.pathsep.join(
                [bin_dir, *(p for p in env.get("PATH", "").split(os.pathsep) if p != bin_dir)]
            )
            proc = subprocess.Popen(
                _shell(),
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
        os.set_blocking(master, False)
        return cls(proc, master)

    async def bridge(self, websocket: WebSocket) -> None:
        """Pump output to the socket and input to the shell; returns when the shell exits or the
        browser disconnects."""
        loop = asyncio.get_running_loop()
        output: asyncio.Queue[bytes] = asyncio.Queue()

        def readable() -> None:
            try:
                data = os.read(self.master, READ_CHUNK)
            except BlockingIOError:
                return
            except OSError:  # EIO: the shell exited
                data = b""
            if not data:
                loop.remove_reader(self.master)
            output.put_nowait(data)

        loop.add_reader(self.master, readable)

        async def pump_out() -> None:
            decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            while True:
                data = await output.get()
                if not data:
                    await websocket.close(code=1000, reason="shell exited")
                    return
                text = decoder.decode(data)
                if text:
                    await websocket.send_text(text)

        async def pump_in() -> None:
            while True:
                message = json.loads(await websocket.receive_text())
                if isinstance(message.get("input"), str):
                    os.write(self.master, message["input"].encode())
                size = message.get("resize")
                if isinstance(size, list) and len(size) == 2:
                    _set_size(self.master, size[0], size[1])

        tasks = [asyncio.create_task(pump_out()), asyncio.create_task(pump_in())]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            with contextlib.suppress(ValueError, OSError):
                loop.remove_reader(self.master)

    def close(self) -> None:
        """Hang up: stop the shell's whole process group and close the pty."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signal.SIGHUP)
        try:
            self.proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=5)
        with contextlib.suppress(OSError):
            os.close(self.master)
