"""The server's own directories never reach a tenant: every text that leaves through the API or the
portal (refusals, reasons, events) names them relative to the platform instead (issue 29 item 4).

A message is made deep down (a tenant file refused by `backends.tenant_files`, a ``podman run`` error,
a mount check) with the host path in it, which the server's log keeps for the admin; on its way out it
goes through `redact`: a storage area ``STORAGE/u<id>/NAME[/rest]`` becomes ``storage:NAME[/rest]``,
anything else under the data directory ``DATA-DIR/...`` (``DATA-DIR/clusters/c/jobs/1.log``). The roots
are registered by each `Services` when it is made (a process may serve tests' several servers: every
registered root is redacted, which hides nothing a tenant should see). Inside containers the kernel
still shows a bind mount's source path relative to its filesystem in ``/proc/self/mountinfo``: see
`mountinfo_warning`.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path

DATA_LABEL = "DATA-DIR"
_lock = threading.Lock()
_rules: list[tuple[re.Pattern[str], str]] = []
_registered: set[str] = set()
_END = r"(?=[/\s'\":,;)\]]|$)"  # the root ends there: not a longer name beside it (data2, data-old)


def _spellings(path: Path) -> list[str]:
    """`path` as given and resolved (a link such as /tmp -> /private/tmp shows either way)."""
    spellings = {os.path.abspath(path), os.path.realpath(path)} - {"/"}  # "/" is no private root
    return sorted(spellings, key=len, reverse=True)


def register(data_dir: Path | None, storage_root: Path | None = None) -> None:
    """Redact `data_dir` and `storage_root` (either may be None) in every text `redact` sees from now."""
    with _lock:
        for spelling in _spellings(storage_root) if storage_root is not None else []:
            _add(re.escape(spelling) + r"/u\d+/([^/\s'\":,;)\]]+)", r"storage:\1")
            _add(re.escape(spelling) + _END, "STORAGE-ROOT")
        for spelling in _spellings(data_dir) if data_dir is not None else []:
            _add(re.escape(spelling) + _END, DATA_LABEL)
        # the longest root first: a storage root inside the data directory is named by its area
        _rules.sort(key=lambda rule: len(rule[0].pattern), reverse=True)


def _add(pattern: str, replacement: str) -> None:
    if pattern not in _registered:
        _registered.add(pattern)
        _rules.append((re.compile(pattern), replacement))


def redact(text: str) -> str:
    """`text` with every registered root replaced (see the module docstring)."""
    if not text or "/" not in text:
        return text
    for pattern, replacement in _rules:
        text = pattern.sub(replacement, text)
    return text


def redact_value(value: object) -> object:
    """`value` (an event's detail: strings, numbers, lists and mappings of them) with `redact` applied
    to every string in it."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, Mapping):
        return {key: redact_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value]
    return value


def mountinfo_warning(data_dir: Path, storage_root: Path) -> str | None:
    """What to tell the admin when the container backend's bind-mount sources lie below a filesystem's
    root: the kernel shows that path (e.g. ``/home/srv/.elastrain/clusters/c/home``) to every process in
    the containers through ``/proc/self/mountinfo``, which no mount option hides. None when the data
    directory and the storage root each are a filesystem's root or lie on the other's (then containers
    see ``/clusters/c/home``, ``/storage/u2/ckpt``)."""
    data, storage = Path(os.path.realpath(data_dir)), Path(os.path.realpath(storage_root))
    roots = {data} if storage.is_relative_to(data) else {data, storage}  # one inside the other: its own
    below = sorted(str(p) for p in roots if _mount_point(p) not in roots)
    if not below:
        return None
    own = "is not a filesystem of its own" if len(below) == 1 else "are not filesystems of their own"
    return (
        f"{' and '.join(below)} {own}: processes in containers can read the path in /proc/self/mountinfo "
        "(a bind mount's source); mount a filesystem of its own there (a partition, a volume, a loop "
        "image) to show them only relative paths"
    )


def _mount_point(path: Path) -> Path:
    """The mount point of the filesystem holding `path` (which exists or is below one that does)."""
    while not os.path.ismount(path) and path != path.parent:
        path = path.parent
    return path
