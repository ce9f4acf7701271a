"""A write that failed because the data directory's file system is full (ENOSPC, EDQUOT, SQLite's
SQLITE_FULL): the API answers 507 Insufficient Storage, saying what to do, instead of a 500."""

from __future__ import annotations

import errno

_FULL_ERRNOS = {errno.ENOSPC, errno.EDQUOT}
_SQLITE_FULL = "database or disk is full"
DISK_FULL_DETAIL = (
    "the server's data directory is full: this change was not saved (nothing else was changed); "
    "free space there and retry — reads keep working"
)


def is_disk_full(exc: BaseException) -> bool:
    """Whether `exc`, or an exception it was raised from, says the disk is full."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in _FULL_ERRNOS:
            return True
        if _SQLITE_FULL in str(current):
            return True
        current = current.__cause__ or current.__context__
    return False
