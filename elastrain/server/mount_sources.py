"""What a cluster may mount, by who asks: its owner's storage areas (``storage:NAME:/data``), datasets an
admin declared (``dataset:NAME:/data``, read-only), and host paths (``/srv/x:/data``, admins only).

A cluster's mounts are stored as records (``source``, ``target``, ``kind``, ``name``, ``read_only``):
the API shows a storage or dataset mount by its name, never the server's path, and `check_storage_mounts`
re-verifies each storage area when a container starts (`check_stored_mounts`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastrain.backends.api import Mount
from elastrain.db.models import User
from elastrain.server.errors import Conflict, Forbidden, InvalidRequest, NotFound
from elastrain.server.storage import StorageAreas, verify_area_path
from elastrain.server.validation import check_mount_format, check_name, normal_target, parse_mount

STORAGE = "storage"
DATASET = "dataset"
HOST = "host"
NAMED_KINDS = (STORAGE, DATASET)
HOST_PATHS_FOR_ADMINS = (
    "host-path mounts are for admins only; mount one of your storage areas instead: "
    "--mount storage:NAME:/data (elastrain storage create NAME)"
)


def named_source(source: str) -> tuple[str, str] | None:
    """(kind, name) of a ``storage:NAME`` or ``dataset:NAME`` mount source; None for a host path."""
    kind, sep, name = source.partition(":")
    return (kind, name) if sep and kind in NAMED_KINDS else None


def parse_datasets(specs: Sequence[str]) -> dict[str, Path]:
    """``NAME=HOSTPATH`` (the server's ``--dataset``) as {name: resolved directory}; a ValueError says
    which one is wrong and how."""
    datasets: dict[str, Path] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not path:
            raise ValueError(
                f"--dataset {spec!r} is not NAME=HOSTPATH; write e.g. --dataset mnist=/srv/mnist"
            )
        try:
            check_name(name, "dataset name")
        except InvalidRequest as exc:
            raise ValueError(f"--dataset {spec!r}: {exc}") from None
        real = Path(path).expanduser().resolve()
        if not real.is_dir():
            raise ValueError(f"--dataset {spec!r}: {real} is not a directory")
        datasets[name] = real
    return datasets


@dataclass
class MountSources:
    """Resolves a create request's mounts for one user (see the module docstring)."""

    storage: StorageAreas | None  # None: a server without storage areas (storage:NAME is refused)
    datasets: Mapping[str, Path] = field(default_factory=dict)
    allowed_roots: list[Path] = field(default_factory=list)
    protected_trees: Sequence[Path] = ()
    protected_files: Sequence[Path] = ()

    def resolve(self, user: User, spec: str) -> Mount:
        """The `Mount` for `spec` as `user` asks it: 404 for a storage area or dataset of that name that
        `user` lacks (another tenant's area alike), 403 for a host path from a non-admin."""
        source, target = check_mount_format(spec)
        named = named_source(source)
        if named is None:
            if not user.is_admin:
                raise Forbidden(HOST_PATHS_FOR_ADMINS)
            return parse_mount(spec, self.allowed_roots, self.protected_trees, self.protected_files)
        kind, name = named
        if kind == STORAGE:
            if self.storage is None:
                raise Conflict("this server keeps no storage areas; mount a dataset or ask an admin")
            area = self.storage.get(user.id, name)
            return Mount(str(area.path), normal_target(target))
        if name not in self.datasets:
            known = ", ".join(sorted(self.datasets)) or "none (an admin declares them: --dataset NAME=PATH)"
            raise NotFound(f"dataset {name!r} not found; datasets: {known}")
        return Mount(str(self.datasets[name]), normal_target(target), read_only=True)

    def record(self, spec: str, mount: Mount) -> dict[str, Any]:
        """What the cluster row keeps of a resolved mount."""
        source, _target = check_mount_format(spec)
        kind, name = named_source(source) or (HOST, "")
        return {"source": mount.source, "target": mount.target, "kind": kind, "name": name,
                "read_only": mount.read_only}  # fmt: skip


def shown_mount(record: Mapping[str, Any]) -> str:
    """A stored mount as the API shows it: ``storage:NAME:/data``, ``dataset:NAME:/data`` or (a host
    path, or a record from before storage areas) ``SOURCE:TARGET``."""
    kind = record.get("kind", HOST)
    if kind in NAMED_KINDS:
        return f"{kind}:{record['name']}:{record['target']}"
    return f"{record['source']}:{record['target']}"


def stored_mounts(text: str | None) -> list[Mount]:
    """The `Mount`s of a cluster row's ``mounts`` column."""
    return [Mount(m["source"], m["target"], bool(m.get("read_only"))) for m in json.loads(text or "[]")]


def mounted_areas(text: str | None) -> set[str]:
    """The names of the storage areas a cluster row's ``mounts`` column mounts."""
    return {m["name"] for m in json.loads(text or "[]") if m.get("kind") == STORAGE}


def check_stored_mounts(text: str | None, owner_uid: int | None, owner_is_admin: bool) -> None:
    """Before a container starts: each storage area it mounts still is a plain directory that only the
    server can rename or replace (`verify_area_path`; 403 otherwise), and a host path is mounted only
    for an admin (a tenant's cluster recorded by a server before storage areas is refused, 403)."""
    for record in json.loads(text or "[]"):
        if record.get("kind") == STORAGE:
            verify_area_path(Path(record["source"]), owner_uid)
        elif record.get("kind", HOST) == HOST and not owner_is_admin:
            raise Forbidden(f"mount {shown_mount(record)}: {HOST_PATHS_FOR_ADMINS} (recreate the cluster)")
