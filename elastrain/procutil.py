"""Process helpers shared by the launcher and the agent."""

from __future__ import annotations

import ctypes
import signal
import sys
from collections.abc import Callable

_PR_SET_PDEATHSIG = 1


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child get `sig` when its parent dies (Linux); None elsewhere.

    Without it a `kill -9` of the launcher (or of an agent) would leave its children running.
    """
    if not sys.platform.startswith("linux"):
        return None

    def _set() -> None:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)

    return _set


class Spawner:
    """Starts child processes from one long-lived thread.

    PR_SET_PDEATHSIG fires when the *thread* that forked the child exits, so children must not be
    started from short-lived threads (an RPC connection's reader, say).
    """

    def __init__(self) -> None:
        from concurrent.futures import ThreadPoolExecutor

        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elastrain-spawner")

    def call(self, fn: Callable[[], object]) -> object:
        """Run `fn` on the spawner thread and return its result."""
        return self._pool.submit(fn).result()

    def shutdown(self) -> None:
        """Stop the thread (children started from it then get their death signal)."""
        self._pool.shutdown(wait=False)


def resolve_python(command: list[str]) -> list[str]:
    """A bare ``python``/``python3`` means the interpreter elastrain runs under (its venv)."""
    if command and command[0] in ("python", "python3"):
        return [sys.executable, *command[1:]]
    return command
