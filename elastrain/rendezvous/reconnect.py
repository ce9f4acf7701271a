"""A coordinator connection that survives a coordinator restart.

When the connection breaks, it tries again every half second for `bound_s` seconds, greeting the new
coordinator with a fresh ``hello`` (built by `hello_fn`, so it can say what this peer is doing now).
Requests made meanwhile wait for the reconnection; after the bound they fail with CoordinatorLost
and `on_give_up` runs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from elastrain.errors import CoordinatorLost
from elastrain.rendezvous.wire import Message, RpcClient


class ReconnectingClient:
    """`RpcClient` plus reconnection within a time bound."""

    def __init__(
        self,
        address: str,
        token: str,
        hello_fn: Callable[[], Message],
        on_push: Callable[[Message], None],
        bound_s: float,
        on_give_up: Callable[[], None] | None = None,
    ) -> None:
        self.address = address
        self._token = token
        self._hello_fn = hello_fn
        self._on_push = on_push
        self.bound_s = bound_s
        self._on_give_up = on_give_up
        self._closing = False
        self._connected = threading.Event()
        self.lost_since: float | None = None
        self.gave_up = False
        self._lock = threading.Lock()
        self._current = 0  # which connection attempt is the live one; stale disconnects are ignored
        self._attempts = 0
        self._client = self._connect()
        self._connected.set()

    def _connect(self) -> RpcClient:
        with self._lock:
            self._attempts += 1
            attempt = self._attempts
        client = RpcClient(
            self.address,
            self._token,
            self._hello_fn(),
            on_push=self._on_push,
            on_disconnect=lambda: self._lost(attempt),
            connect_timeout=5.0,
        )
        with self._lock:
            self._current = attempt
        return client

    def _lost(self, attempt: int) -> None:
        with self._lock:
            if self._closing or self.gave_up or attempt != self._current or self.lost_since is not None:
                return  # a refused attempt, an old connection, or a reconnection already under way
            self._connected.clear()
            self.lost_since = time.monotonic()
        threading.Thread(target=self._reconnect, name="elastrain-reconnect", daemon=True).start()

    def _reconnect(self) -> None:
        deadline = (self.lost_since or time.monotonic()) + self.bound_s
        while not self._closing and time.monotonic() < deadline:
            try:
                client = self._connect()
            except CoordinatorLost:
                time.sleep(0.5)
                continue
            with self._lock:
                self._client = client
                self.lost_since = None
            self._connected.set()
            if not client.connected:  # it dropped again before we recorded it
                self._lost(self._current)
            return
        if not self._closing:
            self.gave_up = True
            self._connected.set()  # wake waiters: they fail now
            if self._on_give_up is not None:
                self._on_give_up()

    @property
    def connected(self) -> bool:
        """True while connected (not during a reconnection)."""
        return self._connected.is_set() and not self.gave_up

    def request(self, kind: str, timeout: float | None = None, **fields: Any) -> Message:
        """Send a request; across a coordinator restart it is sent again to the new one."""
        while True:
            self._connected.wait()
            if self.gave_up or self._closing:
                raise CoordinatorLost(
                    f"the coordinator at {self.address} is gone (waited {self.bound_s:.0f}s)"
                )
            client = self._client
            try:
                return client.request(kind, timeout=timeout, **fields)
            except CoordinatorLost:
                if client.connected or self._closing:
                    raise  # a timeout, not a lost connection
                time.sleep(0.05)  # let _lost() mark the outage before waiting on it

    def notify(self, kind: str, **fields: Any) -> bool:
        """Send without waiting; False when not connected."""
        return self.connected and self._client.notify(kind, **fields)

    def close(self) -> None:
        """Close for good (no reconnection)."""
        self._closing = True
        self._connected.set()
        self._client.close()
