"""Reading jobs' files, which their tenants can write (``/var/log/jobs/<id>.log`` and ``.exit``): through
`elastrain.backends.tenant_files` (no FIFO, link or device is opened for reading, sizes capped), each
read off the caller's thread with a deadline (`bounded`). A request gets an error answer (409 for a
file that is refused, 504/503 for one that is slow) instead of waiting; the job monitor skips the job and
reports its cluster to the reconciler, which shows it ``Degraded`` until the file is readable again or
the job has ended.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from elastrain.backends.api import Backend
from elastrain.backends.tenant_files import (
    LOG_LIMIT,
    READ_DEADLINE_S,
    Piece,
    TenantFileError,
    read_range,
    read_whole,
)
from elastrain.server.bounded import BoundedCalls, Overloaded, TimedOut
from elastrain.server.errors import Conflict

T = TypeVar("T")
REQUEST_DEADLINE_S = 5.0
EXIT_FILE_BYTES = 64


class JobFiles:
    """Bounded reads of jobs' logs and exit files, and the clusters whose job files were refused."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.requests = BoundedCalls("reads of job logs", REQUEST_DEADLINE_S, per_key=4, total=16)
        self.monitor = BoundedCalls("the job monitor's reads", READ_DEADLINE_S, per_key=1, total=8)
        self._lock = threading.Lock()
        self._troubles: dict[str, str] = {}  # cluster -> why, as of the last poll
        self._found: dict[str, str] = {}  # ... found by the poll in progress

    def log(self, cluster: str, path: Path, offset: int) -> Piece:
        """At most `LOG_LIMIT` bytes of a job's log from `offset` (none when the file is gone); a refused
        file is a `Conflict`, a slow one `TimedOut` or `Overloaded`."""
        base = self.backend.tenant_base(cluster)
        try:
            return self.requests.call(cluster, lambda: read_range(path, base, offset, LOG_LIMIT))
        except FileNotFoundError:
            return Piece(b"", offset, 0)
        except TenantFileError as exc:
            raise Conflict(f"the job's log was not read: {exc}") from None

    def begin_poll(self) -> None:
        """A poll of the running jobs starts: troubles found from now on replace the last poll's."""
        self._found = {}

    def end_poll(self) -> None:
        """The poll is over: its troubles are the clusters' troubles now."""
        with self._lock:
            self._troubles = self._found

    def troubles(self) -> dict[str, str]:
        """Clusters whose running jobs' files the last poll could not read, and why."""
        with self._lock:
            return dict(self._troubles)

    def new_log(self, cluster: str, job_id: int, path: Path, offset: int) -> Piece | None:
        """What the job's log holds after `offset`, its last `LOG_LIMIT` bytes at most (progress is read
        from the newest lines; a log growing faster is skipped ahead). None: not read now."""
        base = self.backend.tenant_base(cluster)
        piece = self._monitored(cluster, job_id, lambda: read_range(path, base, None, LOG_LIMIT))
        if piece is None or piece.offset + len(piece.data) <= offset:
            return None
        skip = max(offset - piece.offset, 0)
        return Piece(piece.data[skip:], piece.offset + skip, piece.size)

    def exit_code(self, cluster: str, job_id: int, path: Path) -> int | None:
        """The exit code the job's runner recorded in `path` (None: none, or not read)."""
        base = self.backend.tenant_base(cluster)
        data = self._monitored(cluster, job_id, lambda: read_whole(path, base, EXIT_FILE_BYTES))
        try:
            return int(data.strip()) if data is not None else None
        except ValueError:
            return None

    def _monitored(self, cluster: str, job_id: int, read: Callable[[], T]) -> T | None:
        """`read()` for the job monitor; None when the file is gone, refused or slow (then the cluster
        is reported)."""
        try:
            return self.monitor.call(cluster, read)
        except FileNotFoundError:
            return None
        except (OSError, TenantFileError, TimedOut, Overloaded) as exc:
            self._found[cluster] = f"job {job_id}'s files are not read: {exc}"
            return None
