"""Per-tenant bounds of `elastrain server` that are not quotas: what one user may hold open at once.

Each has a flag, an environment variable and a settings-file key (`elastrain.server.settings`):

    --max-exec-streams N          ELASTRAIN_MAX_EXEC_STREAMS       (default 8)
    --lab-max-message-bytes N     ELASTRAIN_LAB_MAX_MESSAGE_BYTES  (default 16 MiB)

``--max-exec-streams``: a user's concurrent ``exec`` streams (each a host process); one more is a
429 problem. ``--lab-max-message-bytes``: the largest WebSocket message the JupyterLab proxy takes
from a lab (a larger one closes that socket with 1009 instead of being buffered).
"""

from __future__ import annotations

import argparse

DEFAULT_MAX_EXEC_STREAMS = 8
DEFAULT_LAB_MAX_MESSAGE_BYTES = 16 << 20


def add_tenant_limit_flags(p: argparse.ArgumentParser) -> None:
    """The flags of this module's bounds (argparse defaults None: environment/file/default apply)."""
    p.add_argument(
        "--max-exec-streams",
        type=int,
        metavar="N",
        help="concurrent exec streams per user (429 beyond; env ELASTRAIN_MAX_EXEC_STREAMS; "
        f"default {DEFAULT_MAX_EXEC_STREAMS})",
    )
    p.add_argument(
        "--lab-max-message-bytes",
        type=int,
        metavar="N",
        help="largest WebSocket message from a JupyterLab through the portal (the socket closes with "
        "1009 above it; env ELASTRAIN_LAB_MAX_MESSAGE_BYTES; default 16 MiB)",
    )
