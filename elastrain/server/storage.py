"""Tenants' storage areas: directories the platform creates and owns, one tree per user.

Layout under the storage root (default ``<data-dir>/storage``)::

    <root>/                 0700, the server's
    <root>/u<user id>/      0700, the server's
    <root>/u<user id>/NAME  0700, owned by the tenant's uid (in containers; the server's elsewhere)

A cluster mounts ``storage:NAME`` as that last directory. Why a symbolic link cannot redirect the mount:
every directory above the area belongs to the server (or root) and nobody else may write to it, so only
the server can rename or replace the area or anything above it; what the tenant controls (the area's
contents) lies below the mount point, which the bind mount does not resolve. `verify_area_path` checks
exactly that when a container starts (an ``O_PATH | O_NOFOLLOW`` walk from ``/``: no component may be a
link, each one above the area the server's or root's and not writable by others), so even a root that
an admin placed under a tenant-writable directory is refused rather than mounted.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
import threading
from dataclasses import dataclass
from pathlib import Path

from elastrain.backends.filemodes import PRIVATE_DIR
from elastrain.server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from elastrain.server.validation import check_name

DEFAULT_MAX_AREAS = 20
"""Storage areas one user may have (``--storage-areas-per-user``)."""
_TRASH_PREFIX = ".deleting-"  # never a DNS label: no area can be named so


@dataclass(frozen=True)
class StorageArea:
    """One user's storage area: its name and its directory on the server."""

    name: str
    path: Path


class StorageAreas:
    """Create, list, delete and verify storage areas under `root` (see the module docstring)."""

    def __init__(self, root: Path, max_per_user: int = DEFAULT_MAX_AREAS) -> None:
        self.root = root
        self.max_per_user = max_per_user
        self._lock = threading.Lock()  # the count quota: check and create as one step

    def _user_dir(self, user_id: int) -> Path:
        return self.root / f"u{user_id}"

    def prepare(self) -> None:
        """Create the root (0700, the server's) and refuse one a link or another user could redirect."""
        self.root.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
        os.chmod(self.root, PRIVATE_DIR)
        _walk_server_owned(self.root)

    def areas(self, user_id: int) -> list[StorageArea]:
        """`user_id`'s areas, by name."""
        user_dir = self._user_dir(user_id)
        if not user_dir.is_dir():
            return []
        names = sorted(p.name for p in user_dir.iterdir() if not p.name.startswith(_TRASH_PREFIX))
        return [StorageArea(name, user_dir / name) for name in names]

    def get(self, user_id: int, name: str) -> StorageArea:
        """`user_id`'s area `name`; 404 when they have none of that name (another user's alike, and a
        name no area can have)."""
        try:
            check_name(name, "storage area name")
        except InvalidRequest:
            raise NotFound(f"storage area {name!r} not found (no area has such a name)") from None
        path = self._user_dir(user_id) / name
        if not path.is_dir() or path.is_symlink():
            raise NotFound(
                f"storage area {name!r} not found; create it with `elastrain storage create {name}`"
            )
        return StorageArea(name, path)

    def create(self, user_id: int, name: str, owner_uid: int | None) -> StorageArea:
        """A new empty area `name` of `user_id`, owned by `owner_uid` (the tenant's uid in containers;
        None: the server's). 409 when it exists, 429 past the per-user count."""
        check_name(name, "storage area name")
        with self._lock:
            user_dir = self._user_dir(user_id)
            user_dir.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
            os.chmod(user_dir, PRIVATE_DIR)
            if len(self.areas(user_id)) >= self.max_per_user:
                raise Forbidden(
                    f"you have {self.max_per_user} storage areas, the most allowed; delete one first "
                    "(elastrain storage delete NAME)"
                )
            path = user_dir / name
            try:
                path.mkdir(mode=PRIVATE_DIR)
            except FileExistsError:
                raise Conflict(f"storage area {name!r} exists already") from None
            if owner_uid is not None:
                try:
                    os.chown(path, owner_uid, owner_uid, follow_symlinks=False)
                except PermissionError:
                    pass  # a server that is not root: the area stays its own (0700)
            os.chmod(path, PRIVATE_DIR)
            return StorageArea(name, path)

    def delete(self, user_id: int, name: str) -> None:
        """Remove `user_id`'s area `name` and everything in it: first renamed away (the name is free and
        no container start finds it), then removed without following links (`shutil.rmtree`)."""
        area = self.get(user_id, name)
        trash = area.path.with_name(f"{_TRASH_PREFIX}{name}-{secrets.token_hex(4)}")
        os.rename(area.path, trash)
        shutil.rmtree(trash, ignore_errors=True)


def verify_area_path(path: Path, owner_uid: int | None) -> str:
    """`path` (an area's directory) to bind-mount, after the walk of the module docstring: 403 when a
    component is a link or could be changed by someone other than the server, or the area is owned by
    neither `owner_uid` (None: the server's user) nor the server; 404 when it is gone."""
    if not path.is_dir():
        raise NotFound(f"storage area {path.name!r} is gone; recreate it (elastrain storage create NAME)")
    _walk_server_owned(path.parent)
    fd = _open_dir_nofollow(path.parent, path.name)
    try:
        info = os.fstat(fd)
    finally:
        os.close(fd)
    if info.st_uid not in (owner_uid if owner_uid is not None else os.geteuid(), os.geteuid()):
        raise Forbidden(f"storage area {path.name!r} is not owned by its tenant (uid {info.st_uid}); refused")
    return str(path)


def _open_dir_nofollow(parent: Path, name: str) -> int:
    """An ``O_PATH`` descriptor of directory `parent`/`name`, not through a link (403 for a link)."""
    dirfd = os.open(parent, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        return os.open(name, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dirfd)
    except OSError as exc:
        raise Forbidden(
            f"storage path {parent / name} is not a plain directory ({exc.strerror}); refused"
        ) from None
    finally:
        os.close(dirfd)


def _walk_server_owned(path: Path) -> None:
    """Walk `path` (absolute) from ``/`` with ``O_PATH | O_NOFOLLOW``: every component a directory (not
    a link) owned by root or this server's user, and writable by no one else (a sticky directory such as
    /tmp aside: there only an entry's owner may rename it). A `Forbidden` names the first that is not."""
    me = os.geteuid()
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY)
    current = Path("/")
    try:
        for part in path.parts[1:]:
            try:
                nxt = os.open(part, os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            except OSError as exc:
                raise Forbidden(
                    f"storage path {current / part} is not a plain directory ({exc.strerror}); refused"
                ) from None
            os.close(fd)
            fd, current = nxt, current / part
            info = os.fstat(fd)
            others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
            sticky = info.st_mode & stat.S_ISVTX
            if info.st_uid not in (0, me) or (others_write and not sticky):
                raise Forbidden(
                    f"storage path {current} could be replaced by another user (owner uid {info.st_uid}, "
                    f"mode {stat.S_IMODE(info.st_mode):o}); put the storage root under directories only "
                    "root or the server's user may change"
                )
    finally:
        os.close(fd)
