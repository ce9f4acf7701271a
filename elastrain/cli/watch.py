"""Following clusters over time: ``cluster get NAME -w`` / ``cluster list -w`` (a row per change) and
``cluster create/scale --wait`` (a live status line until every container runs, or ``--timeout``).

The API has no streaming endpoint for cluster state, so both poll ``GET /clusters`` at a modest
interval; nothing here changes anything on the server.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TextIO

from elastrain.cli.output import OutputFormat, render_change
from elastrain.cli.progress import StatusLine, TimedOut, timeout_seconds
from elastrain.cli.table import CLUSTER_HEADER, cluster_row, format_row_lines
from elastrain.errors import ConfigError

if TYPE_CHECKING:
    from elastrain.client import Client, ClusterInfo

WATCH_INTERVAL_S = 1.0  # -w: one GET a second is plenty for a human and nothing for the server
WAIT_INTERVAL_S = 0.5  # --wait: a little finer, the status line's elapsed time moves with it
DEFAULT_WAIT_S = 120.0  # --wait without --timeout
DELETED = "Deleted"


def add_wait_flags(parser: argparse.ArgumentParser, wait_help: str) -> None:
    """``--wait`` and ``--timeout SECONDS`` (the bound of the wait)."""
    parser.add_argument("--wait", action="store_true", help=wait_help)
    parser.add_argument(
        "--timeout",
        type=timeout_seconds,
        metavar="SECONDS",
        help=f"with --wait: give up after SECONDS (exit 1; the cluster is left as it is; "
        f"default {DEFAULT_WAIT_S:.0f})",
    )


def add_watch_flags(parser: argparse.ArgumentParser, watch_help: str) -> None:
    """``-w/--watch`` and ``--timeout SECONDS`` (when the watch stops by itself)."""
    parser.add_argument("-w", "--watch", action="store_true", help=watch_help)
    parser.add_argument(
        "--timeout", type=timeout_seconds, metavar="SECONDS", help="with -w: stop watching after SECONDS"
    )


def check_timeout_flag(args: argparse.Namespace) -> None:
    """``--timeout`` bounds a wait or a watch: alone it would do nothing, so it is refused."""
    if getattr(args, "timeout", None) is None:
        return
    if getattr(args, "wait", True) is False:
        raise ConfigError("--timeout bounds --wait: add --wait (or drop --timeout)")
    if getattr(args, "watch", True) is False:
        raise ConfigError("--timeout bounds -w/--watch: add -w (or drop --timeout)")


def fetch_clusters(client: Client, name: str | None) -> list[ClusterInfo]:
    """The clusters being watched: `name` only ([] once it is gone), or all of the caller's."""
    from elastrain.client import ClientError

    if name is None:
        return client.list_clusters()
    try:
        return [client.get_cluster(name)]
    except ClientError as exc:
        if exc.status == 404:
            return []
        raise


class ClusterWatch:
    """Prints one row (or JSON line, or YAML document) each time a watched cluster changes.

    `observe(clusters)` takes one poll's answer; a cluster that disappears is printed once more with
    state ``Deleted``. Table columns are sized by the first rows seen (kubectl does the same).
    """

    def __init__(self, fmt: OutputFormat, out: TextIO | None = None) -> None:
        self.fmt = fmt
        self.out = out if out is not None else sys.stdout
        self._last: dict[str, str] = {}  # name -> what was printed for it
        self._known: dict[str, ClusterInfo] = {}
        self._widths: list[int] | None = None

    def observe(self, clusters: list[ClusterInfo]) -> int:
        """Print what changed since the last poll; returns the number of lines/documents printed."""
        changed = [c for c in clusters if self._last.get(c.name) != self._fingerprint(c)]
        gone = [self._known[n] for n in self._known if n not in {c.name for c in clusters}]
        lines: list[str] = []
        if self.fmt is OutputFormat.TABLE:
            rows = [cluster_row(c) for c in changed] + [cluster_row(c, DELETED) for c in gone]
            if self._widths is None and rows:
                self._widths = [max(len(r[i]) for r in [CLUSTER_HEADER, *rows]) for i in range(len(rows[0]))]
                lines.append(format_row_lines([CLUSTER_HEADER], self._widths))
            lines += [format_row_lines([r], self._widths or []) for r in rows]
        else:
            lines += [render_change(c.summary(), self.fmt) for c in changed]
            lines += [render_change({**c.summary(), "state": DELETED}, self.fmt) for c in gone]
        for c in changed:
            self._last[c.name], self._known[c.name] = self._fingerprint(c), c
        for c in gone:
            del self._last[c.name], self._known[c.name]
        if lines:
            self.out.write("\n".join(lines) + "\n")
            self.out.flush()
        return len(lines)

    def _fingerprint(self, cluster: ClusterInfo) -> str:
        if self.fmt is OutputFormat.TABLE:  # a change no column shows would print a duplicate row
            return "\t".join(cluster_row(cluster))
        return json.dumps(cluster.summary(), sort_keys=True)


def watch_clusters(
    client: Client,
    name: str | None,
    fmt: OutputFormat,
    timeout: float | None = None,
    *,
    interval: float = WATCH_INTERVAL_S,
    out: TextIO | None = None,
) -> int:
    """`cluster get NAME -w` (`name`) or `cluster list -w` (None): rows until Ctrl-C or `timeout`
    seconds (both a normal end: exit 0). Watching one cluster ends when it is deleted."""
    from elastrain.client import ClientError

    watch = ClusterWatch(fmt, out)
    deadline = None if timeout is None else time.monotonic() + timeout
    first = True
    try:
        while True:
            clusters = fetch_clusters(client, name)
            if first and name is not None and not clusters:
                raise ClientError(f"cluster {name} not found (HTTP 404)", 404)
            if first and not clusters and fmt is OutputFormat.TABLE:
                print("no clusters yet; watching for new ones (Ctrl-C to stop)", file=sys.stderr)
            watch.observe(clusters)
            first = False
            if name is not None and not clusters:
                return 0
            if deadline is not None and time.monotonic() >= deadline:
                return 0
            pause = interval if deadline is None else min(interval, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
    except KeyboardInterrupt:  # Ctrl-C is how a watch ends
        return 0


def all_running(cluster: ClusterInfo) -> bool:
    """Every desired container exists and runs (what ``--wait`` waits for)."""
    return (
        cluster.state == "Running"
        and len(cluster.running()) == cluster.desired_containers
        and all(c.state == "Running" for c in cluster.containers)
    )


def _pending(cluster: ClusterInfo) -> str:
    """The containers not yet Running, e.g. ``tthvd-worker-2 Pending: no free GPU, +1 more``."""
    waiting = [
        f"{c.name} {c.state}{': ' + c.reason if c.reason else ''}"
        for c in cluster.containers
        if c.state != "Running"
    ]
    missing = cluster.desired_containers - len(cluster.containers)
    if missing > 0:
        waiting.append(f"{missing} container(s) not created yet")
    if not waiting:
        return ""
    return waiting[0] + (f", +{len(waiting) - 1} more" if len(waiting) > 1 else "")


def cluster_status(cluster: ClusterInfo) -> tuple[str, str]:
    """The status line's text and its state key (what a non-TTY prints a line for a change of)."""
    running = f"Running {len(cluster.running())}/{cluster.desired_containers}"
    reason = f" ({cluster.reason})" if cluster.reason else ""
    pending = _pending(cluster)
    text = f"cluster {cluster.name}: {cluster.state}{reason}, {running}" + (
        f"; waiting for {pending}" if pending else ""
    )
    key = "|".join(
        [cluster.state, cluster.reason, running, *(f"{c.name}={c.state}" for c in cluster.containers)]
    )
    return text, key


def wait_for_cluster(
    client: Client,
    name: str,
    timeout: float,
    status: StatusLine,
    condition: Callable[[ClusterInfo], bool] = all_running,
    *,
    interval: float = WAIT_INTERVAL_S,
    what: str = "to have every container Running",
) -> ClusterInfo:
    """Poll until `condition` holds, showing each poll on `status`; `TimedOut` after `timeout` seconds
    (the cluster is left as it is: the message says what is pending and how to look at it)."""
    deadline = time.monotonic() + timeout
    while True:
        cluster = client.get_cluster(name)
        text, key = cluster_status(cluster)
        status.update(text, key)
        if condition(cluster):
            return cluster
        if time.monotonic() >= deadline:
            pending = _pending(cluster) or f"state {cluster.state}"
            raise TimedOut(
                f"timed out after {timeout:g}s waiting for cluster {name} {what} "
                f"({cluster.state}, Running {len(cluster.running())}/{cluster.desired_containers}; "
                f"still pending: {pending}); the cluster is left as it is: check it with "
                f"`elastrain cluster describe {name}` or follow it with `elastrain cluster get {name} -w`"
            )
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
