"""Input checks with messages that say how to fix the value: names, sizes, mounts, frameworks."""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from pathlib import Path

from elastrain.backends.api import Mount
from elastrain.db.models import Framework, RestartPolicy
from elastrain.db.session import sqlite_path
from elastrain.server.errors import Conflict, Forbidden, InvalidRequest

NAME_MAX = 63
NAME_PATTERN = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"
"""A DNS label (RFC 1123): the names of clusters and users, in the API schema as in `check_name`."""
_DNS_LABEL = re.compile(NAME_PATTERN)
_SIZE_DIGITS = {"": 15, "B": 15, "K": 12, "M": 9, "G": 6, "T": 3, "P": 1}
"""The most integer digits before each unit: every size `SIZE_PATTERN` admits is below 10 PiB."""
_SIZE_UNITS = (  # (unit letter, its spellings)
    ("", "B?"),
    ("K", "(?:[Kk]i?|KB)"),
    ("M", "(?:[Mm]i?|MB)"),
    ("G", "(?:[Gg]i?|GB)"),
    ("T", "(?:[Tt]i?|TB)"),
    ("P", "(?:[Pp]i?|PB)"),
)
SIZE_BODY = "|".join(rf"[0-9]{{1,{_SIZE_DIGITS[u]}}}(?:\.[0-9]+)? *{spelled}" for u, spelled in _SIZE_UNITS)
SIZE_PATTERN = f"^ *(?:{SIZE_BODY}) *$"
"""A size such as ``512Mi``, ``2Gi``, ``1G`` or ``1048576`` (bytes), as `parse_size` takes it."""
OPTIONAL_SIZE_PATTERN = f"^(?: *(?:{SIZE_BODY}) *)?$"
"""A size or ``""`` (none)."""
_SIZE = re.compile(SIZE_PATTERN)
_SIZE_PARTS = re.compile(r" *([0-9]+(?:\.[0-9]+)?) *([A-Za-z]*) *")
_UNITS = {
    "": 1, "B": 1,
    "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5,
    "KI": 1024, "MI": 1024**2, "GI": 1024**3, "TI": 1024**4, "PI": 1024**5,
    "KB": 1000, "MB": 1000**2, "GB": 1000**3, "TB": 1000**4, "PB": 1000**5,
}  # fmt: skip
MIN_CONTAINERS = 2
MAX_CONTAINERS = 64
MAX_GPUS_PER_CONTAINER = 1024
CONTROL = r"\x00-\x1f\x7f-\x9f"
"""Control characters (C0, DEL, C1) as a regex class body: refused in every string the API takes."""
ARG_CONTROL = r"\x00-\x08\x0b-\x1f\x7f-\x9f"
"""The same less tab and newline, which a command argument may hold (a ``sh -c`` or ``python -c`` script)."""
TEXT_PATTERN = f"^[^{CONTROL}]*$"
ARG_PATTERN = f"^[^{ARG_CONTROL}]*$"
MOUNT_PATTERN = f"^(/[^{CONTROL}]*|(storage|dataset):[a-z0-9]([a-z0-9-]{{0,61}}[a-z0-9])?):/[^:{CONTROL}]*$"
"""``SOURCE:TARGET``, both absolute (the format; where SOURCE may be is the server's to judge)."""
_CONTROL_CHAR = re.compile(f"[{CONTROL}]")
_ARG_CONTROL_CHAR = re.compile(f"[{ARG_CONTROL}]")


def check_text(value: str, what: str, *, argument: bool = False) -> str:
    """Refuse control characters in `value` (an `argument` may hold tabs and newlines); the message
    names the character and its offset, never the value (which may be long or hold secrets)."""
    found = (_ARG_CONTROL_CHAR if argument else _CONTROL_CHAR).search(value)
    if found is not None:
        raise InvalidRequest(
            f"{what} holds the control character U+{ord(found.group()):04X} at offset {found.start()}; "
            "remove it"
        )
    return value


def shown(value: object, limit: int = 80) -> str:
    """`value` quoted for a one-line message (control characters escaped), cut after `limit` characters."""
    text = str(value)
    return repr(text) if len(text) <= limit else repr(text[:limit]) + "..."


def check_name(name: str, what: str = "cluster name") -> str:
    """A DNS label: lowercase letters, digits and '-', 1..63 characters, alphanumeric at both ends."""
    if not isinstance(name, str) or not _DNS_LABEL.fullmatch(name):
        raise InvalidRequest(
            f"{what} {shown(name)} is not a DNS label: use 1-63 lowercase letters, digits and '-', "
            "starting and ending with a letter or digit (e.g. 'tthvd')"
        )
    return name


def check_framework(value: str) -> Framework:
    """The framework enum member for `value`; the refusal lists the valid ones."""
    try:
        return Framework(value)
    except ValueError:
        valid = ", ".join(f.value for f in Framework)
        raise InvalidRequest(f"unknown framework {shown(value)}; valid frameworks: {valid}") from None


def check_restart_policy(value: str) -> RestartPolicy:
    """The restart policy enum member for `value`; the refusal lists the valid ones."""
    try:
        return RestartPolicy(value)
    except ValueError:
        valid = ", ".join(p.value for p in RestartPolicy)
        raise InvalidRequest(f"restart_policy must be one of: {valid} (got {shown(value)})") from None


def check_containers(count: int, limit: int = MAX_CONTAINERS) -> int:
    """A container count: one launcher plus at least one worker."""
    if count < MIN_CONTAINERS:
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
    low = check_bound(containers if low is None else low, "min_containers", limit)
    high = check_bound(containers if high is None else high, "max_containers", limit)
    if not low <= containers <= high:
        raise InvalidRequest(
            f"need min_containers <= containers <= max_containers (got {low} <= {containers} <= {high})"
        )
    return low, high


def check_bound(count: int, what: str, limit: int = MAX_CONTAINERS) -> int:
    """One elastic bound (`what`: min_containers or max_containers) on its own: 2..`limit`."""
    if count < MIN_CONTAINERS:
        raise InvalidRequest(
            f"{what} must be at least 2 (got {count}): the count includes the launcher, "
            "so 2 means one launcher and one worker"
        )
    if count > limit:
        raise InvalidRequest(f"{what} must be at most {limit} (got {count})")
    return count


def check_gpus(count: int) -> int:
    """GPUs per container: 0..`MAX_GPUS_PER_CONTAINER` (whether the node has them is checked apart)."""
    if count < 0:
        raise InvalidRequest(f"gpus per container must be >= 0 (got {count})")
    if count > MAX_GPUS_PER_CONTAINER:
        raise InvalidRequest(f"gpus per container must be at most {MAX_GPUS_PER_CONTAINER} (got {count})")
    return count


def parse_size(text: str) -> int:
    """Bytes from a size like ``512Mi``, ``2Gi``, ``1G`` or ``1048576`` (`SIZE_PATTERN`: below 10 PiB)."""
    parts = _SIZE_PARTS.fullmatch(str(text))
    if parts is None or not _SIZE.fullmatch(str(text)):
        number, unit = parts.groups() if parts else ("", "")
        digits = _SIZE_DIGITS.get(unit[:1].upper())
        if digits is not None and len(number.split(".")[0]) > digits:
            most = f"at most {digits} digit{'s' if digits > 1 else ''}" + (f" before {unit}" if unit else "")
            raise InvalidRequest(f"size {shown(text)} is too large: {most} (sizes stay below 10Pi)")
        raise InvalidRequest(f"size {shown(text)} is not understood; write e.g. 512Mi, 2Gi or 1G")
    number, unit = parts.groups()
    return int(float(number) * _UNITS[unit.upper()])


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


RESERVED_TARGETS = ("/", "/etc", "/etc/mpi", "/var", "/var/log")
"""Mount targets the platform needs as they are (a mount exactly there is refused with 403)."""
RESERVED_TREES = (
    "/etc/mpi",  # the hostfile
    "/var/log",  # the container's log; /var/log/jobs: job logs and exit codes (written by the server)
    "/etc/elastrain",  # the cluster's ssh and munge keys
    "/run/elastrain",  # the API socket
    "/etc/hosts",
    "/etc/nsswitch.conf",
    "/etc/environment",  # the process and Slurm backends write the container's environment there
    "/container.json",  # ... and, at the root of the container's directory, its record,
    "/ready",  # its init's readiness file,
    "/.ready.tmp",
    "/slurm-batch.sh",  # and the Slurm job's script
)
"""Paths the platform writes or serves: a mount at one of them or anywhere under it is refused (403).
On the process and Slurm backends a mount is a symbolic link in the container's directory, so a mount at
/var/log/jobs would make the server write job logs into the tenant's chosen directory."""


def reserved_by(target: str) -> str | None:
    """The reserved path `target` (normalised) is, or is under; None for an ordinary target."""
    if target in RESERVED_TARGETS:
        return target
    return next((tree for tree in RESERVED_TREES if target == tree or target.startswith(tree + "/")), None)


def check_mount_format(spec: str) -> tuple[str, str]:
    """SOURCE and TARGET of ``SOURCE:TARGET``: SOURCE ``storage:NAME``, ``dataset:NAME`` or absolute,
    TARGET absolute, no '..', no control characters, and a
    TARGET other than /, /etc, /var and not at or under a path the platform writes (`RESERVED_TREES`:
    /etc/mpi, /var/log, ...)."""
    check_text(str(spec), "mount")
    source, sep, target = str(spec).rpartition(":")
    if not sep or not source or not target:
        raise InvalidRequest(f"mount {shown(spec)} is not SOURCE:TARGET; write e.g. storage:NAME:/data")
    kind, named, name = source.partition(":")
    if named and kind in ("storage", "dataset"):
        check_name(name, f"{kind} name")
    elif not os.path.isabs(source):
        raise InvalidRequest(
            f"mount source {shown(source)} must be an absolute path (the CLI resolves ./data for you)"
        )
    if ".." in Path(source).parts or ".." in Path(target).parts:
        raise InvalidRequest(f"mount {shown(spec)} may not contain '..'")
    if not target.startswith("/"):
        raise InvalidRequest(
            f"mount target {shown(target)} must be an absolute path such as /data (not / or /etc)"
        )
    reserved = reserved_by(normal_target(target))
    if reserved is not None:  # well-formed, but the platform's own: a refusal
        where = "" if reserved == normal_target(target) else f" (it is under {reserved})"
        raise Forbidden(
            f"mount target {shown(target)} is reserved by the platform{where}: not /, /etc, /var, or "
            "anywhere under /etc/mpi or /var/log; mount at a path such as /data"
        )
    return source, target


def normal_target(target: str) -> str:
    """A mount target without empty and ``.`` parts (``//data/./x/`` -> ``/data/x``)."""
    return "/" + "/".join(part for part in target.split("/") if part not in ("", "."))


def parse_mount(
    spec: str,
    allowed_roots: list[Path],
    protected_trees: Sequence[Path] = (),
    protected_files: Sequence[Path] = (),
) -> Mount:
    """``SOURCE:TARGET`` (`check_mount_format`, 422) with a SOURCE inside an allowed root (else 403, checked
    first: no probing of paths outside them) that (links resolved) never exposes the server's own state
    (`check_not_protected`, 403) and exists (else 409: the request is valid, the server lacks it)."""
    source, target = check_mount_format(spec)
    real = Path(source).resolve()
    roots = [r.resolve() for r in allowed_roots]
    if not any(real == root or root in real.parents for root in roots):  # first: no probing outside
        listed = ", ".join(str(r) for r in roots) or "(none)"
        raise Forbidden(
            f"mount source {source} is outside the allowed roots ({listed}); "
            "start the server with --allow-mount DIR to allow it"
        )
    check_not_protected(source, real, protected_trees, protected_files)
    if not real.exists():
        raise Conflict(f"mount source {source} does not exist on the server; create it first")
    return Mount(str(real), normal_target(target))


def check_mount_unchanged(mount: Mount) -> None:
    """Refuse (at container start) a mount whose source no longer resolves to itself: it was stored
    resolved, so a link now in its path (e.g. one a tenant made in a mounted directory) points it elsewhere,
    perhaps at what `check_not_protected` refused. A target a server before `RESERVED_TREES` accepted
    (e.g. /var/log/jobs) is refused here too, before the backend links anything there."""
    reserved = reserved_by(normal_target(mount.target))
    if reserved is not None:
        raise Forbidden(
            f"mount target {shown(mount.target)} is reserved by the platform ({reserved}); refused "
            "(delete and recreate the cluster with the mount at a path such as /data)"
        )
    real = os.path.realpath(mount.source)
    if real != mount.source:
        raise Forbidden(
            f"mount source {mount.source} now leads elsewhere through a symbolic link; refused "
            "(replace the link by the directory, or delete and recreate the cluster)"
        )
