"""One bounded wait: poll a condition until it holds, fail with a message after a timeout."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from elastrain.errors import ConfigError

T = TypeVar("T")


class WaitTimeout(ConfigError, AssertionError):
    """A wait ran out of time. A `ConfigError` (the CLI prints it as one line) and an
    `AssertionError` (a test fails on it like on an `assert`)."""


def wait_until(
    condition: Callable[[], T | None],
    timeout: float = 20.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    abort: Callable[[], str | None] | None = None,
) -> T:
    """Poll `condition` every `interval` seconds until it returns something truthy, and return that.

    Raises `WaitTimeout` ("timed out after Ns waiting for <what>") after `timeout` seconds, or with
    the message `abort()` returns as soon as it returns one (e.g. "the job ended before ...").
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if abort is not None and (reason := abort()):
            raise WaitTimeout(reason)
        if time.monotonic() > deadline:
            raise WaitTimeout(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def poll(
    condition: Callable[[], object],
    timeout: float,
    interval: float = 0.1,
    abort: Callable[[], bool] | None = None,
) -> bool:
    """`wait_until` that answers instead of raising: True once `condition()` holds; False at the
    timeout; once `abort()` is true, whether `condition()` holds at that last look."""
    aborted = False

    def stop() -> str | None:
        nonlocal aborted
        aborted = abort is not None and abort()
        return "aborted" if aborted else None

    try:
        wait_until(condition, timeout, interval=interval, abort=stop)
    except WaitTimeout:
        return bool(condition()) if aborted else False
    return True
