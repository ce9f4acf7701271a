"""Per-tenant bounds of `elastrain server` that are not quotas: what one user may hold open at once.

Each has a flag, an environment variable and a settings-file key (`elastrain.server.settings`):

    --max-exec-streams N          ELASTRAIN_MAX_EXEC_STREAMS       (default 8)
    --max-running-jobs N          ELASTRAIN_MAX_RUNNING_JOBS       (default 16)
    --report-rate R               ELASTRAIN_REPORT_RATE            (default 10 per second)
    --max-terminals N             ELASTRAIN_MAX_TERMINALS          (default 8)
    --max-lab-sockets N           ELASTRAIN_MAX_LAB_SOCKETS        (default 32)
    --lab-max-message-bytes N     ELASTRAIN_LAB_MAX_MESSAGE_BYTES  (default 16 MiB)

``--max-exec-streams``: a user's concurrent ``exec`` streams (each a host process); one more is a
429 problem. ``--max-running-jobs``: a user's Running jobs (submitted or attached); one more is a
429. ``--report-rate``: progress and incident reports per second per job (bursts of 5 seconds'
worth); beyond it a report is refused with 429 (`elastrain.reporting` sends one a second).
``--max-terminals`` / ``--max-lab-sockets``: a user's open portal-terminal WebSockets (tabs) and
JupyterLab WebSockets through the portal (kernels, terminals); one more is closed at once (code
4429, or a 429 answer to the handshake). ``--lab-max-message-bytes``: the largest WebSocket message
the JupyterLab proxy takes from a lab (a larger one closes that socket with 1009 instead of being
buffered). Admins are not exempt. Nothing heavy is imported here: every CLI command loads the server's flags.
"""

from __future__ import annotations

import argparse

from elastrain.server.start_backoff import GIVE_UP_AFTER

DEFAULT_MAX_EXEC_STREAMS = 8
DEFAULT_MAX_RUNNING_JOBS = 16
DEFAULT_REPORT_RATE = 10.0
DEFAULT_MAX_TERMINALS = 8
DEFAULT_MAX_LAB_SOCKETS = 32
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
        "--max-running-jobs",
        type=int,
        metavar="N",
        help="Running jobs per user (429 beyond; env ELASTRAIN_MAX_RUNNING_JOBS; "
        f"default {DEFAULT_MAX_RUNNING_JOBS})",
    )
    p.add_argument(
        "--report-rate",
        type=float,
        metavar="R",
        help="progress/incident reports per second per job (429 beyond, bursts of 5 s worth; env "
        f"ELASTRAIN_REPORT_RATE; default {DEFAULT_REPORT_RATE:g})",
    )
    for flag, default, what in (
        ("terminals", DEFAULT_MAX_TERMINALS, "portal-terminal WebSockets"),
        ("lab-sockets", DEFAULT_MAX_LAB_SOCKETS, "JupyterLab WebSockets through the portal"),
    ):
        p.add_argument(
            f"--max-{flag}",
            type=int,
            metavar="N",
            help=f"open {what} per user (one more is refused; env "
            f"ELASTRAIN_MAX_{flag.upper().replace('-', '_')}; default {default})",
        )
    p.add_argument(
        "--start-attempts",
        type=int,
        metavar="N",
        help="refused starts in a row after which a cluster's containers are no longer started (it shows "
        f"Degraded until scaled; env ELASTRAIN_START_ATTEMPTS; default {GIVE_UP_AFTER})",
    )
    p.add_argument(
        "--lab-max-message-bytes",
        type=int,
        metavar="N",
        help="largest WebSocket message from a JupyterLab through the portal (the socket closes with "
        "1009 above it; env ELASTRAIN_LAB_MAX_MESSAGE_BYTES; default 16 MiB)",
    )
