"""Failures of single reconcile steps: kept to their cluster, logged and recorded once each.

A decision that raises (a backend error, a tenant's odd files) must not stall reconciliation for every
other tenant: the reconciler applies each decision in its own transaction, and on an error rolls it
back, skips that cluster's remaining decisions for the pass and reports the error here. The same error
of the same cluster, failing again every pass, is logged and recorded (event ``reconcile.failed``) only
the first time.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable

from elastrain.db.models import EventAction
from elastrain.db.repository import add_event
from elastrain.db.session import Database

log = logging.getLogger("elastrain.reconciler")
MAX_DISTINCT = 20  # distinct errors reported per cluster (an error text holding e.g. a pid varies)
MAX_REASON = 300


def one_line(exc: BaseException, limit: int = MAX_REASON) -> str:
    """``Type: first line of the message``, at most `limit` characters."""
    lines = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {lines[0].strip()}" if lines else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


class StepFailures:
    """Reports failed reconcile steps, once per cluster and distinct error."""

    def __init__(self, db: Database, actor: str, limit: int = MAX_DISTINCT) -> None:
        self.db = db
        self.actor = actor
        self.limit = limit
        self._seen: dict[tuple[str, str], set[str]] = {}  # (cluster, uid) -> reasons already reported
        self._lock = threading.Lock()  # clusters' steps report from their own threads

    def first(self, key: tuple[str, str], reason: str) -> bool:
        """True the first time `reason` is reported for `key` (and while under the limit)."""
        with self._lock:
            seen = self._seen.setdefault(key, set())
            if reason in seen or len(seen) >= self.limit:
                return False
            seen.add(reason)
            return True

    def report(
        self, cluster: str, uid: str, step: str, exc: Exception, container: str = "", record: bool = True
    ) -> None:
        """Log the failure of `step` on `cluster` and add a ``reconcile.failed`` event to its trail (with
        `record`), unless this error of this cluster was reported already."""
        reason = one_line(exc)
        if not self.first((cluster, uid), reason):
            return
        where = f"{cluster}/{container}" if container else cluster or "(server)"
        log.error("reconcile: %s of %s failed: %s", step, where, reason, exc_info=exc)
        if not record or not cluster:
            return
        detail: dict[str, object] = {"step": step, "reason": reason}
        if container:
            detail["container"] = container
        try:
            with self.db.session() as session:
                add_event(session, self.actor, EventAction.reconcile_failed, cluster, None, **detail)
        except Exception as again:  # the database itself failing: the log line above says enough
            log.error("reconcile: cannot record the failure of %s: %s", where, one_line(again))

    def keep_only(self, clusters: Iterable[tuple[str, str]]) -> None:
        """Forget the clusters (``(name, uid)``) not in `clusters`: deleted ones. Failures without a
        cluster uid (orphan containers, hooks) are kept: they would be reported again every pass."""
        keep = set(clusters)
        with self._lock:
            for key in [k for k in self._seen if k[1] and k not in keep]:
                del self._seen[key]
