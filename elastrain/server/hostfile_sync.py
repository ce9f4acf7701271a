"""Keeping each cluster's hostfile file equal to the database's (e.g. after a crash, or a tenant's
change to it): read back bounded, rewritten when it differs, one cluster's failure its own."""

from __future__ import annotations

import time
from collections.abc import Callable

from elastrain.backends.api import Backend
from elastrain.backends.local import HOSTFILE_PATH
from elastrain.backends.tenant_files import READ_DEADLINE_S, TenantFileError, read_whole
from elastrain.db.models import Cluster, ClusterState
from elastrain.db.repository import all_clusters
from elastrain.db.session import Database
from elastrain.server.bounded import Overloaded, TimedOut
from elastrain.server.metrics_stats import ReconcileStats
from elastrain.server.reconcile_errors import StepFailures
from elastrain.server.reconcile_isolation import ClusterSteps

HOSTFILE_RECHECK_S = 5.0  # how often every hostfile file is read back even when nothing changed


def hostfile_text(cluster: Cluster) -> str:
    """The full hostfile text of a cluster (generation line + host lines)."""
    return f"# generation: {cluster.hostfile_generation}\n" + cluster.hostfile_text


class HostfileSync:
    """Rewrites a cluster's hostfile file when it differs from the DB. A file this loop wrote or read
    back is trusted for `HOSTFILE_RECHECK_S`: a pass every 0.1 s while containers start must not read
    every cluster's file each time (that CPU is the API's). The file is one its tenant may replace (a
    FIFO, a link): each cluster's check and write run as its bounded step (`ClusterSteps`), skipped
    while an earlier step of the cluster hangs."""

    def __init__(
        self,
        db: Database,
        backend: Backend,
        steps: ClusterSteps,
        stats: ReconcileStats,
        failures: StepFailures,
    ) -> None:
        self.db, self.backend, self.steps, self.stats, self.failures = db, backend, steps, stats, failures
        self.known: dict[str, str] = {}  # cluster -> the hostfile text its file holds
        self.checked_at = float("-inf")

    def sync(self) -> None:
        """One round over every cluster with a hostfile."""
        now = time.monotonic()
        recheck = now - self.checked_at >= HOSTFILE_RECHECK_S
        if recheck:
            self.checked_at = now
        known, self.known = self.known, {}
        with self.db.session() as session:
            wanted = [
                (cluster.name, cluster.uid, hostfile_text(cluster))
                for cluster in all_clusters(session)
                if cluster.state != ClusterState.Terminating and cluster.hostfile_generation > 0
            ]
        for name, uid, text in wanted:
            if self.steps.busy(name):
                continue  # its steps hang: its files may too
            if not recheck and known.get(name) == text:
                self.known[name] = text
                continue
            try:
                if self.steps.calls.call(name, self._check(name, text), READ_DEADLINE_S):
                    self.known[name] = text
            except (TimedOut, Overloaded):
                continue  # shown Degraded once past the step deadline
            except Exception as exc:
                self.stats.failed("hostfile")
                self.failures.report(name, uid, "sync_hostfile", exc, record=False)

    def _check(self, cluster: str, text: str) -> Callable[[], bool]:
        """The step: True when the file holds `text` (rewritten if it did not); False when its
        directory is gone."""

        def step() -> bool:
            on_disk = self.backend.hostfile_path(cluster)
            if on_disk is not None:
                try:
                    current: str | None = read_whole(on_disk, self.backend.tenant_base(cluster)).decode(
                        errors="replace"
                    )
                except (OSError, TenantFileError):
                    current = None
                if current == text:
                    return True
                if not on_disk.parent.exists():
                    return False
            self.backend.write_cluster_file(cluster, HOSTFILE_PATH, text)
            return True

        return step
