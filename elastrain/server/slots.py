"""How many of something (exec streams, terminal and lab WebSockets) each user holds open at once."""

from __future__ import annotations

import threading
from collections.abc import Callable

from elastrain.db.models import User
from elastrain.server.errors import TooMany
from elastrain.server.tenant_limits import (
    DEFAULT_MAX_EXEC_STREAMS,
    DEFAULT_MAX_LAB_SOCKETS,
    DEFAULT_MAX_TERMINALS,
)


class UserSlots:
    """At most `limit` `what` per user at once; one more is `TooMany` (429) naming `flag`."""

    def __init__(self, limit: int, what: str, flag: str) -> None:
        self.limit, self.what, self.flag = limit, what, flag
        self._lock = threading.Lock()
        self._open: dict[int, int] = {}

    def open(self, user: User) -> Callable[[], None]:
        """Take one of `user`'s slots (TooMany when they hold `limit`); returns its release (idempotent)."""
        with self._lock:
            held = self._open.get(user.id, 0)
            if held >= self.limit:
                raise TooMany(
                    f"user {user.name} has {held} {self.what} open, the most allowed at once "
                    f"({self.flag}); close one and retry"
                )
            self._open[user.id] = held + 1
        released = threading.Event()

        def release() -> None:
            with self._lock:
                if released.is_set():
                    return
                released.set()
                self._open[user.id] -= 1
                if not self._open[user.id]:
                    del self._open[user.id]

        return release

    def held(self, user_id: int) -> int:
        """What user `user_id` holds now."""
        with self._lock:
            return self._open.get(user_id, 0)


def exec_slots(limit: int = DEFAULT_MAX_EXEC_STREAMS) -> UserSlots:
    """Concurrent exec streams per user (``--max-exec-streams``)."""
    return UserSlots(limit, "exec streams", "--max-exec-streams")


def terminal_slots(limit: int = DEFAULT_MAX_TERMINALS) -> UserSlots:
    """Open portal-terminal WebSockets per user (``--max-terminals``)."""
    return UserSlots(limit, "terminal connections", "--max-terminals")


def lab_slots(limit: int = DEFAULT_MAX_LAB_SOCKETS) -> UserSlots:
    """Open JupyterLab WebSockets through the portal per user (``--max-lab-sockets``)."""
    return UserSlots(limit, "JupyterLab WebSockets", "--max-lab-sockets")
