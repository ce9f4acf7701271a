"""Reading a file a tenant can write (job logs and exit files, a container's init log and metadata, the
hostfile copy): never blocks on open, never follows a link, never reads more than a cap.

Whatever a tenant placed at such a path is refused or bounded here:
- each directory below `base` is opened with ``O_NOFOLLOW | O_DIRECTORY`` and the file itself with
  ``O_RDONLY | O_NONBLOCK | O_NOFOLLOW`` relative to it, so a FIFO's open returns at once and a symbolic
  link (to another tenant's file, or a loop) anywhere below `base` is refused;
- ``fstat`` of the opened descriptor must show a regular file (a FIFO, socket or device is refused);
- a whole-file read refuses a file over `max_bytes` (a 50 GB sparse file costs nothing); a range read
  returns at most `limit` bytes, from an offset or from the end (a log's tail);
- reads go in `CHUNK`-byte pieces and stop at a deadline. One ``read`` the kernel blocks in (a file on
  a FUSE mount that answers slowly) is bounded by running the call off-thread with a deadline
  (`elastrain.server.bounded`).
"""

from __future__ import annotations

import errno
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from elastrain.errors import ElastrainError

CHUNK = 64 * 1024
LOG_LIMIT = 1 << 20  # the most bytes one log read returns
SMALL_FILE = 1 << 20  # the largest metadata/exit/hostfile file read whole
READ_DEADLINE_S = 2.0
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_NOCTTY | os.O_CLOEXEC


class TenantFileError(ElastrainError):
    """A tenant-writable file that was not read: a link, not a regular file, too large, or too slow."""


@dataclass(frozen=True)
class Piece:
    """Bytes read from a file: `data` starts at `offset`; `size` is the file's size when opened."""

    data: bytes
    offset: int
    size: int


def open_beneath(path: Path, base: Path | None = None) -> int:
    """A read-only, non-blocking descriptor of the regular file `path`; with `base` (a directory the
    server owns) no component below it may be a link. Missing: FileNotFoundError; anything else
    refused: `TenantFileError`."""
    if base is None:
        parent, parts = os.open(path.parent, _DIR_FLAGS & ~os.O_NOFOLLOW), [path.name]
    else:
        try:
            parts = list(path.relative_to(base).parts)
        except ValueError:
            raise TenantFileError(f"{path} is not under {base}: not read") from None
        if not parts or ".." in parts:
            raise TenantFileError(f"{path} names no file under {base}: not read")
        parent = os.open(base, _DIR_FLAGS & ~os.O_NOFOLLOW)
    try:
        for part in parts[:-1]:
            child = _step(parent, part, _DIR_FLAGS, path)
            os.close(parent)
            parent = child
        fd = _step(parent, parts[-1], _FILE_FLAGS, path)
    finally:
        os.close(parent)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise TenantFileError(f"{path} is not a regular file ({_kind(mode)}): not read")
    return fd


def _step(parent: int, name: str, flags: int, path: Path) -> int:
    """Open `name` in directory `parent` without following a link."""
    try:
        return os.open(name, flags, dir_fd=parent)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR, errno.EMLINK):
            raise TenantFileError(f"{path}: {name} is a symbolic link or not a directory: not read") from None
        raise


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory")):
        if test(mode):
            return name
    return "a device"


def read_whole(
    path: Path, base: Path | None = None, max_bytes: int = SMALL_FILE, deadline_s: float = READ_DEADLINE_S
) -> bytes:
    """The whole regular file `path`, refused (`TenantFileError`) when over `max_bytes`."""
    fd = open_beneath(path, base)
    try:
        size = os.fstat(fd).st_size
        if size > max_bytes:
            raise TenantFileError(f"{path} holds {size} bytes, more than the {max_bytes} read: not read")
        data = _read(fd, path, 0, max_bytes + 1, deadline_s)
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise TenantFileError(f"{path} grew past the {max_bytes} bytes read: not read")
    return data


def read_range(
    path: Path,
    base: Path | None = None,
    offset: int | None = 0,
    limit: int = LOG_LIMIT,
    deadline_s: float = READ_DEADLINE_S,
) -> Piece:
    """At most `limit` bytes of `path` from `offset`, or its last `limit` bytes when `offset` is None."""
    fd = open_beneath(path, base)
    try:
        size = os.fstat(fd).st_size
        start = max(size - limit, 0) if offset is None else max(offset, 0)
        data = _read(fd, path, start, limit, deadline_s) if start < size else b""
    finally:
        os.close(fd)
    return Piece(data, start, size)


def tail_lines(path: Path, base: Path | None = None, limit: int = LOG_LIMIT) -> list[str]:
    """The lines of the last `limit` bytes of the log `path` (from the first whole line); none when it
    does not exist."""
    try:
        piece = read_range(path, base, None, limit)
    except FileNotFoundError:
        return []
    data = piece.data
    if piece.offset > 0:
        data = data[data.find(b"\n") + 1 :] if b"\n" in data else b""
    return data.decode(errors="replace").splitlines(keepends=True)


def last_lines(lines: list[str], limit: int = LOG_LIMIT) -> list[str]:
    """The last of `lines` that together hold at most `limit` bytes."""
    kept = 0
    for start in range(len(lines) - 1, -1, -1):
        kept += len(lines[start].encode())
        if kept > limit:
            return lines[start + 1 :]
    return lines


def _read(fd: int, path: Path, offset: int, limit: int, deadline_s: float) -> bytes:
    """Up to `limit` bytes from `offset`, in `CHUNK` pieces, within `deadline_s`."""
    deadline = time.monotonic() + deadline_s
    pieces: list[bytes] = []
    got = 0
    while got < limit:
        piece = os.pread(fd, min(CHUNK, limit - got), offset + got)
        if not piece:
            break
        pieces.append(piece)
        got += len(piece)
        if time.monotonic() > deadline:
            raise TenantFileError(f"{path} is read too slowly (over {deadline_s:g} s): not read")
    return b"".join(pieces)
