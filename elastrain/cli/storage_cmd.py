"""`elastrain storage`: the caller's storage areas, which clusters mount (a thin layer over the client).

elastrain storage create mnist        # an empty area, yours alone (your uid owns it in containers)
elastrain storage list
elastrain storage delete mnist        # and every file in it (refused while a cluster mounts it)
elastrain cluster create c --mount storage:mnist:/data
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.cli.table import format_table
from elastrain.errors import ConfigError

if TYPE_CHECKING:
    from elastrain.client import Client

MOUNT_HELP = (
    "storage:NAME:/data (elastrain storage create NAME), dataset:NAME:/data (read-only), or a host path "
    "(admins only)"
)


def resolve_mount(spec: str, cwd: Path | None = None) -> str:
    """``./data:/data`` -> ``/abs/path/data:/data`` (resolved here); ``storage:``/``dataset:`` as given."""
    if spec.startswith(("storage:", "dataset:")):
        return spec
    source, sep, target = spec.rpartition(":")
    if not sep or not source or not target:
        raise ConfigError(f"--mount {spec!r} is not SRC:DST; write e.g. --mount ./data:/data")
    path = Path(source).expanduser()
    if not path.is_absolute():
        path = (cwd or Path.cwd()) / path
    return f"{os.path.normpath(path)}:{target}"


def add_storage_parser(sub: argparse._SubParsersAction, conn: argparse.ArgumentParser) -> None:
    """Register `elastrain storage` with its `create`, `list` and `delete` commands."""
    storage = sub.add_parser(
        "storage", help="create, list and delete your storage areas (storage:NAME mounts)"
    )
    ssub = storage.add_subparsers(dest="action", required=True, parser_class=type(storage))
    p = ssub.add_parser("create", parents=[conn], help="create an empty storage area")
    p.add_argument("name", help="DNS-label name, e.g. mnist; a cluster mounts it as storage:NAME:/data")
    p = ssub.add_parser("list", parents=[conn], help="your storage areas and the clusters mounting them")
    p.add_argument("-o", "--output", choices=["table", "json"], default="table")
    p = ssub.add_parser("delete", parents=[conn], help="delete a storage area and every file in it")
    p.add_argument("name")


def run_storage_command(client: Client, args: argparse.Namespace) -> int:
    """Run one `elastrain storage` command."""
    if args.action == "create":
        area = client.create_storage(args.name)
        print(f"storage area {area['name']} created; mount it with --mount {area['mount']}")
    elif args.action == "delete":
        client.delete_storage(args.name)
        print(f"storage area {args.name} deleted")
    elif args.output == "json":
        print(json.dumps(client.list_storage(), indent=2))
    else:
        rows = [[a["name"], a["mount"], ", ".join(a["mounted_by"]) or "-"] for a in client.list_storage()]
        print(format_table([["NAME", "MOUNT", "MOUNTED BY"], *rows]))
    return 0
