"""The CLI's live status line for long work (`cluster create/scale --wait`, `image build`, `simulate`),
and the ``--timeout SECONDS`` flag that bounds that work.

On a terminal the line is redrawn in place (``\\r`` then clear-to-end) with the elapsed time; anywhere
else (CI logs, pipes) a plain line is printed each time the state changes, never once per tick.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import TextIO

from elastrain.errors import ConfigError, ElastrainError

CLEAR_TO_END = "\x1b[K"
RETRY_ALARM_S = 0.5  # how soon a swallowed timeout is raised again


class TimedOut(ElastrainError):
    """Long work ran past ``--timeout``; the message says what was still pending and how to check it."""


def format_elapsed(seconds: float) -> str:
    """``42s``, ``3m05s``, ``2h07m``, ``3d04h``: short enough for the end of a status line."""
    s = max(0, int(seconds))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def timeout_seconds(text: str) -> float:
    """argparse ``type`` of ``--timeout``: a positive, finite number of seconds."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, e.g. 300, got {text!r}") from None
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"must be a positive number of seconds, e.g. 300, got {text!r}")
    return value


class StatusLine:
    """One status line on `stream` (stderr by default): `update` sets its text, `tick` refreshes the
    elapsed time, `message` prints a permanent line above it, `close` ends it.

    `tty` (default: ``stream.isatty()``) picks the mode: redraw in place, or a plain line per change
    of `key` (what identifies the state; by default the text itself). Thread-safe, so a `Ticker` can
    redraw it while the main thread is blocked.
    """

    def __init__(
        self,
        stream: TextIO | None = None,
        *,
        tty: bool | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        # sys.stderr looked up now, not at import (tests swap it)
        self.stream = stream if stream is not None else sys.stderr
        self.tty = _isatty(self.stream) if tty is None else tty
        self.clock = clock
        self.started = clock()
        self._text = ""
        self._key: str | None = None
        self._printed: str | None = None  # the text of the last plain line (no TTY)
        self._drawn = False
        self._lock = threading.Lock()

    def elapsed(self) -> float:
        """Seconds since the line was created."""
        return self.clock() - self.started

    def render(self) -> str:
        """The current text with the elapsed time appended."""
        return f"{self._text}  {format_elapsed(self.elapsed())}"

    def update(self, text: str, key: str | None = None) -> None:
        """Show `text`; without a TTY it is printed only when `key` (default `text`) changed and the
        text differs from the last line printed."""
        with self._lock:
            self._text = text
            if self.tty:
                self._draw()
                return
            key = text if key is None else key
            if key != self._key and text != self._printed:
                self._key, self._printed = key, text
                self.stream.write(self.render() + "\n")
                self.stream.flush()

    def tick(self) -> None:
        """Redraw with the elapsed time brought up to date (a TTY only: elsewhere ticks print nothing)."""
        with self._lock:
            if self.tty and self._text:
                self._draw()

    def message(self, line: str, out: TextIO | None = None) -> None:
        """Print `line` for good (to stdout by default), keeping the status line below it."""
        with self._lock:
            self._wipe()
            target = out if out is not None else sys.stdout
            target.write(line + "\n")
            target.flush()
            if self.tty and self._text:
                self._draw()

    def close(self, keep: bool = True) -> None:
        """End the line: on a TTY the last status stays on screen (`keep`) or is wiped."""
        with self._lock:
            if self.tty and self._drawn:
                self.stream.write("\n" if keep else "\r" + CLEAR_TO_END)
                self.stream.flush()
            self._drawn = False

    def _draw(self) -> None:
        # longer than the terminal, the line would wrap and `\r` would redraw only its last row
        width = _columns(self.stream) - 1
        self.stream.write("\r" + self.render()[:width] + CLEAR_TO_END)
        self.stream.flush()
        self._drawn = True

    def _wipe(self) -> None:
        if self.tty and self._drawn:
            self.stream.write("\r" + CLEAR_TO_END)
            self.stream.flush()
            self._drawn = False


class Ticker:
    """Calls `status.tick()` every `interval` seconds from a daemon thread while in its ``with``
    block: the elapsed time keeps moving while the main thread waits on a subprocess."""

    def __init__(self, status: StatusLine, interval: float = 0.5) -> None:
        self.status, self.interval = status, interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="elastrain-status", daemon=True)

    def __enter__(self) -> Ticker:
        if self.status.tty:  # elsewhere a tick prints nothing: no thread needed
            self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.status.tick()


@contextmanager
def raise_after(seconds: float | None, make_error: Callable[[], ElastrainError]) -> Iterator[None]:
    """Raise ``make_error()`` in the main thread once `seconds` have passed (SIGALRM); None: no limit.

    For work that blocks without a loop to check a deadline in (a subprocess, a long simulation): the
    exception unwinds it like Ctrl-C would (`subprocess.run` kills its child on the way out).
    """
    if seconds is None:
        yield
        return
    if threading.current_thread() is not threading.main_thread():
        raise ConfigError("--timeout works in the main thread only; run the command without it")

    fired = False

    def on_alarm(_signum: int, _frame: FrameType | None) -> None:
        nonlocal fired
        fired = True
        # A raise inside a GC callback or a __del__ is printed and swallowed, not propagated (CI
        # saw hypothesis's gc callback eat it): ring again soon until the exception gets through.
        signal.setitimer(signal.ITIMER_REAL, RETRY_ALARM_S)
        if not isinstance(sys.exc_info()[1], TimedOut):  # not while the first one is unwinding
            raise make_error()

    previous = signal.signal(signal.SIGALRM, on_alarm)
    started = time.monotonic()
    earlier, _interval = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
        if earlier > 0:  # someone else's alarm (pytest-timeout's, say) goes back with what it had left
            signal.setitimer(signal.ITIMER_REAL, max(0.001, earlier - (time.monotonic() - started)))
    if fired:  # the work finished, but only after every raise was swallowed: still past the limit
        raise make_error()


def _columns(stream: TextIO) -> int:
    """The width of the terminal `stream` draws on ($COLUMNS first, as `shutil` reads it)."""
    if "COLUMNS" not in os.environ:
        try:
            columns = os.get_terminal_size(stream.fileno()).columns
        except (AttributeError, OSError, ValueError):  # not a real file (a StringIO), or no size
            columns = 0
        if columns >= 20:  # a fresh pty can answer 0
            return columns
    return shutil.get_terminal_size((100, 24)).columns


def _isatty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # a closed or stream-like object without a terminal
        return False
