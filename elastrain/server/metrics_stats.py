"""What the reconciler counts as it runs, for ``/metrics``: pass durations and failures.

The metric objects are not registered anywhere here: each app's registry (`elastrain.server.metrics`)
registers them, so several servers in one process (tests) never collide.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

from prometheus_client import Counter, Histogram

PASS_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PASS_FAILED = "pass"  # the `step` of a whole pass that raised (the others: a decision's action, "hook")


class ReconcileStats:
    """The reconciler's pass-duration histogram and failure counter (by the step that failed)."""

    def __init__(self) -> None:
        self.pass_seconds = Histogram(
            "elastrain_reconcile_pass_seconds",
            "Duration of one reconcile pass (scheduler, plan, apply, hostfiles, hooks)",
            buckets=PASS_BUCKETS,
            registry=None,
        )
        self.failures = Counter(
            "elastrain_reconcile_failures",
            "Reconcile steps that failed, by step: a decision's action, 'hostfile', 'hook' or 'pass'",
            ["step"],
            registry=None,
        )

    @contextmanager
    def timed_pass(self) -> Iterator[None]:
        """Time one pass; a pass that raises counts as a failure of step 'pass'."""
        started = time.monotonic()
        try:
            yield
        except Exception:
            self.failures.labels(step=PASS_FAILED).inc()
            raise
        finally:
            self.pass_seconds.observe(time.monotonic() - started)

    def failed(self, step: str) -> None:
        """Count one failure of `step` (a bounded name: an action value, 'hostfile', 'hook')."""
        self.failures.labels(step=step).inc()

    def collectors(self) -> tuple[Histogram, Counter]:
        """The metric objects, for a registry."""
        return self.pass_seconds, self.failures
