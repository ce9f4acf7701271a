"""Modes of the files the server writes: private to the server, or shared with one tenant's uid only.

The data directory, the database, tokens, job logs and per-cluster state are never readable by other
users of the machine (0600 files, 0700 directories). What a cluster's containers must read (the
directories bind-mounted into them) belongs to the server with the tenant's uid as its group (0750): the
tenant can read it, nobody else can.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import BinaryIO

PRIVATE_FILE = 0o600
PRIVATE_DIR = 0o700
TENANT_DIR = 0o750


def private_dir(path: Path) -> Path:
    """Create `path` (and missing parents) and make it 0700, also when it existed already."""
    path.mkdir(mode=PRIVATE_DIR, parents=True, exist_ok=True)
    os.chmod(path, PRIVATE_DIR)
    return path


def open_private_append(path: Path) -> BinaryIO:
    """`path` opened for appending; created 0600 when missing (never through a symbolic link)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, PRIVATE_FILE)
    return os.fdopen(fd, "ab")


def tenant_dir(path: Path, tenant_uid: int) -> Path:
    """Create `path` readable by the server and by group `tenant_uid` only (a tenant's containers run as
    ``uid:uid``); without the right to change its group (not root) it stays the server's, 0750."""
    path.mkdir(mode=TENANT_DIR, parents=True, exist_ok=True)
    try:
        os.chown(path, os.geteuid(), tenant_uid, follow_symlinks=False)
    except PermissionError:
        pass
    os.chmod(path, TENANT_DIR)
    return path


def private_file(path: Path) -> None:
    """Make an existing file 0600 (nothing when it is missing)."""
    if path.exists() and not path.is_symlink():
        os.chmod(path, PRIVATE_FILE)
