"""The worker process's exit policy: how an uncaught elastrain exception ends the process.

A worker is the user's script run by the Python interpreter: that is its entry point, and the only
place that decides the exit code. The library raises typed exceptions instead of exiting:

- `WorkerLeft` / `CoordinatorGone` (``SystemExit`` subclasses): the interpreter exits with their
  `ExitCode` (0 / 3), running ``atexit`` handlers as ``sys.exit`` does;
- `JobFailed` with ``reported=True`` (the error already went to the coordinator, which shows it):
  the hook installed here ends the process with `ExitCode.FAILED` at once, without printing the
  traceback again and without waiting for the user's non-daemon threads.

Anything else is left to the previous hooks (Python's: print the traceback, exit 1).
"""

from __future__ import annotations

import os
import sys
import threading
from types import TracebackType
from typing import Any

from elastrain.errors import ExitCode, JobFailed

_INSTALLED = False


def _exit_reported(value: BaseException | None) -> None:
    """End the process with `ExitCode.FAILED` when `value` is a failure already reported."""
    if isinstance(value, JobFailed) and value.reported:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing more to say
                pass
        os._exit(ExitCode.FAILED)


def install_exit_policy() -> None:
    """Install the policy (idempotent); `elastrain.init()` does it for a worker of an `elastrain run` job."""
    global _INSTALLED
    if _INSTALLED:
        return
    _INSTALLED = True
    previous = sys.excepthook
    previous_thread = threading.excepthook

    def excepthook(kind: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
        _exit_reported(value)
        previous(kind, value, tb)

    def thread_excepthook(args: Any) -> None:
        _exit_reported(args.exc_value)
        previous_thread(args)

    sys.excepthook = excepthook
    threading.excepthook = thread_excepthook
