"""Input checks with messages that say how to fix the value: names, sizes, mounts, frameworks."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from elastrain.backends.api import Mount
from elastrain.db.models import Framework
from elastrain.db.session import sqlite_path
from elastrain.server.errors import Forbidden, InvalidRequest

_DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGTP]i?|[kmgtp]i?|[KMGTP]?B?|)\s*$")
_UNITS = {
    "": 1, "B": 1,
    "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5,
    "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4, "PI": 1024**5,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5,
}  # fmt: skip
MAX_CONTAINERS = 64


def check_name(name: str, what: str = "cluster name") -> str:
    """A DNS label: lowercase letters, digits and '-', 1..63 characters, alphanumeric at both ends."""
    if not isinstance(name, str) or not _DNS_LABEL.match(name):
        raise InvalidRequest(
            f"{what} {name!r} is not a DNS label: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (e.g. 'tthvd')"
        )
    return name


def check_framework(value: str) -> Framework:
    """The framework enum member for `value`; the refusal lists the valid ones."""
    try:
        return Framework(value)
    except ValueError:
        valid = ", ".join(f.value for f in Framework)
        raise InvalidRequest(f"unknown framework {value!r}; valid frameworks: {valid}") from None


def check_containers(count: int, limit: int = MAX_CONTAINERS) -> int:
    """A container count: one launcher plus at least one worker."""
    if count < 2:
        raise InvalidRequest(
            f"containers must be at least 2 (got {count}): the count includes the launcher container, "
            "so 2 means one launcher and one worker"
        )
    if count > limit:
        raise InvalidRequest(f"containers must be at most {limit} (got {count})")
    return count


def check_bounds(
    containers: int, low: int | None, high: int | None, limit: int = MAX_CONTAINERS
) -> tuple[int, int]:
    """Elastic bounds ``(min, max)``, ``2 <= min <= containers <= max`` (a missing bound: ``containers``)."""
    low = containers if low is None else low
    high = containers if high is None else high
    if low < 2:
        raise InvalidRequest(
            f"min_containers must be at least 2 (got {low}): the count includes the launcher, "
            "so 2 means one launcher and one worker"
        )
    if high > limit:
        raise InvalidRequest(f"max_containers must be at most {limit} (got {high})")
    if not low <= containers <= high:
        raise InvalidRequest(
            f"need min_containers <= containers <= max_containers (got {low} <= {containers} <= {high})"
        )
    return low, high


def check_gpus(count: int) -> int:
    """GPUs per container: zero or more."""
    if count < 0:
        raise InvalidRequest(f"gpus per container must be >= 0 (got {count})")
    return count


def parse_size(text: str) -> int:
    """Bytes from a size like ``512Mi``, ``2Gi``, ``1G`` or ``1048576``."""
    match = _SIZE.match(str(text))
    if not match:
        raise InvalidRequest(f"size {text!r} is not understood; write e.g. 512Mi, 2Gi or 1G")
    number, unit = match.groups()
    value = float(number) * _UNITS[unit.upper()]
    if value > 2**50:
        raise InvalidRequest(f"size {text!r} is too large")
    return int(value)


def format_size(size: int) -> str:
    """The shortest exact binary-unit spelling of `size` (``1Gi``, ``512Mi``, ``1000``)."""
    for unit, factor in (("Ti", 1024**4), ("Gi", 1024**3), ("Mi", 1024**2), ("Ki", 1024)):
        if size and size % factor == 0:
            return f"{size // factor}{unit}"
    return str(size)


def server_state(data_dir: Path | None, db_url: str) -> tuple[list[Path], list[Path]]:
    """What no mount may expose: the data directory (a tree) and the files of an SQLite database."""
    db = sqlite_path(db_url)
    files = [db.with_name(db.name + suffix) for suffix in ("", "-wal", "-shm", "-journal")] if db else []
    return ([data_dir] if data_dir is not None else []), files


def check_not_protected(source: str, real: Path, trees: Sequence[Path], files: Sequence[Path]) -> None:
    """Refuse (403) a mount of the server's own state: a `trees` directory (the data directory), anything
    inside one or holding one, or a `files` file (the database elsewhere) or a directory holding it."""
    for tree in (t.resolve() for t in trees):
        if real == tree or tree in real.parents or real in tree.parents:
            where = "is" if real == tree else "is inside" if tree in real.parents else "holds"
            raise Forbidden(
                f"mount source {source} {where} the server's data directory (its database and tokens); "
                "mount a directory of your own data"
            )
    for file in (f.resolve() for f in files):
        if real == file or real in file.parents:
            where = "is" if real == file else "holds"
            raise Forbidden(f"mount source {source} {where} the server's database; mount another directory")


def parse_mount(
    spec: str,
    allowed_roots: list[Path],
    protected_trees: Sequence[Path] = (),
    protected_files: Sequence[Path] = (),
) -> Mount:
    """``SOURCE:TARGET`` with an absolute, existing SOURCE inside an allowed root and an absolute TARGET;
    the source (links resolved) never exposes the server's own state (`check_not_protected`)."""
    source, sep, target = str(spec).rpartition(":")
    if not sep or not source or not target:
        raise InvalidRequest(f"mount {spec!r} is not SOURCE:TARGET; write e.g. /home/me/data:/data")
    if not os.path.isabs(source):
        raise InvalidRequest(
            f"mount source {source!r} must be an absolute path (the CLI resolves ./data for you)"
        )
    if ".." in Path(source).parts or ".." in Path(target).parts:
        raise InvalidRequest(f"mount {spec!r} may not contain '..'")
    if not target.startswith("/") or target.rstrip("/") in ("", "/etc", "/etc/mpi", "/var", "/var/log"):
        raise InvalidRequest(
            f"mount target {target!r} must be an absolute path such as /data (not / or /etc)"
        )
    real = Path(source).resolve()
    if not real.exists():
        raise InvalidRequest(f"mount source {source} does not exist; create it first")
    roots = [r.resolve() for r in allowed_roots]
    if not any(real == root or root in real.parents for root in roots):
        listed = ", ".join(str(r) for r in roots) or "(none)"
        raise InvalidRequest(
            f"mount source {source} is outside the allowed roots ({listed}); "
            "start the server with --allow-mount DIR to allow it"
        )
    check_not_protected(source, real, protected_trees, protected_files)
    return Mount(str(real), "/" + target.strip("/"))


def check_mount_unchanged(mount: Mount) -> None:
    """Refuse (at container start) a mount whose source no longer resolves to itself: it was stored
    resolved, so a link now in its path (e.g. one a tenant made in a mounted directory) points it elsewhere,
    perhaps at what `check_not_protected` refused."""
    real = os.path.realpath(mount.source)
    if real != mount.source:
        raise Forbidden(
            f"mount source {mount.source} now leads elsewhere through a symbolic link; refused "
            "(replace the link by the directory, or delete and recreate the cluster)"
        )
