"""Calls that may block on something a tenant controls (a file on a FUSE mount, a backend step in his
cluster), run off the caller's thread with a deadline and a bounded number in flight.

The caller waits at most the deadline, then gets `TimedOut` (504) while the call goes on in its own
thread, holding its slot until it returns. Slots are counted per key (a cluster) and in all: a key or
the whole pool at its bound is answered `Overloaded` (503) at once, so one tenant's stuck calls can
neither pile up threads nor take the slots other tenants' calls need. The server's request threads
and event loop never wait on them without a bound.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

import anyio
import anyio.to_thread

from elastrain.server.errors import ApiError

T = TypeVar("T")
TENANT_READ_THREADS = 8  # request threads reading tenant files at once; the other routes keep the rest
_limiter: list[anyio.CapacityLimiter] = []  # made in the event loop on first use


class TimedOut(ApiError):
    """A bounded call did not return within its deadline (it goes on without the caller)."""

    status = 504


class Overloaded(ApiError):
    """A bounded call was refused: its key or the pool has all its slots taken by calls still running."""

    status = 503


class Pending(Generic[T]):
    """A call started by `BoundedCalls.submit`."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.done = threading.Event()
        self.value: T | None = None
        self.error: BaseException | None = None

    def wait(self, timeout_s: float) -> T:
        """The call's result (or its exception); `TimedOut` when it has not returned in `timeout_s`."""
        if not self.done.wait(max(timeout_s, 0.0)):
            raise TimedOut(f"{self.what} did not return within {timeout_s:g} s: retry later")
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


class BoundedCalls:
    """Runs calls in their own daemon threads: at most `per_key` per key and `total` in all, each waited
    for at most `deadline_s`. `what` names the calls in refusals (e.g. "reads of job logs")."""

    def __init__(
        self,
        what: str,
        deadline_s: float,
        per_key: int = 2,
        total: int = 16,
        on_done: Callable[[str], None] | None = None,
    ) -> None:
        self.what = what
        self.deadline_s = deadline_s
        self.per_key = per_key
        self.total = total
        self.on_done = on_done  # told the key of each call that returns (e.g. to wake a loop)
        self._lock = threading.Lock()
        self._started: dict[str, list[float]] = {}  # key -> start times of its calls in flight

    def call(self, key: str, fn: Callable[[], T], deadline_s: float | None = None) -> T:
        """`fn()`'s result (or its exception), or `TimedOut` after the deadline, `Overloaded` when no
        slot is free."""
        return self.submit(key, fn).wait(self.deadline_s if deadline_s is None else deadline_s)

    def submit(self, key: str, fn: Callable[[], T]) -> Pending[T]:
        """Start `fn()` in its own thread (`Overloaded` when no slot is free); wait on what it returns."""
        started = time.monotonic()
        with self._lock:
            mine = self._started.setdefault(key, [])
            if len(mine) >= self.per_key or sum(map(len, self._started.values())) >= self.total:
                raise Overloaded(
                    f"{self.what} of {key} are still running (at most {self.per_key} per cluster and "
                    f"{self.total} in all): retry later"
                )
            mine.append(started)
        pending: Pending[T] = Pending(f"{self.what} of {key}")

        def run() -> None:
            try:
                pending.value = fn()
            except BaseException as exc:  # handed to the caller, if it still waits
                pending.error = exc
            finally:
                with self._lock:
                    left = self._started.get(key, [])
                    if started in left:
                        left.remove(started)
                    if not left:
                        self._started.pop(key, None)
                pending.done.set()
                if self.on_done is not None:
                    self.on_done(key)

        threading.Thread(target=run, name=f"bounded {self.what}", daemon=True).start()
        return pending

    def busy(self, key: str) -> bool:
        """A call of `key` is still running."""
        with self._lock:
            return bool(self._started.get(key))

    def overdue(self) -> dict[str, float]:
        """Keys with a call running past the deadline, and for how long the oldest has run (s)."""
        now = time.monotonic()
        with self._lock:
            return {
                key: now - min(starts)
                for key, starts in self._started.items()
                if starts and now - min(starts) > self.deadline_s
            }


async def off_loop(fn: Callable[[], T]) -> T:
    """`fn()` (a request's work that reads tenant files) in a worker thread of its own small pool
    (`TENANT_READ_THREADS`): a flood of such requests waits there, never for the threads every other
    route (and ``/healthz``) needs."""
    if not _limiter:
        _limiter.append(anyio.CapacityLimiter(TENANT_READ_THREADS))
    return await anyio.to_thread.run_sync(fn, limiter=_limiter[0])
