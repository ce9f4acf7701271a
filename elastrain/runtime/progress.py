"""Progress reports from a running job to the control plane (rank 0, at most once a second).

Enabled when the job was started by the control plane (`elastrain job submit` sets
ELASTRAIN_REPORT_URL, ELASTRAIN_JOB_ID and ELASTRAIN_REPORT_TOKEN). The HTTP post happens on a
background thread that always sends the latest values, so a slow server never slows training.
"""

from __future__ import annotations

import json
import os
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastrain.runtime.checkpoint import Manifest


class ProgressReporter:
    """Rate-limited, non-blocking reporter of step, epoch, loss, samples/s, world size and hosts."""

    def __init__(self, environ: dict[str, str] | None = None, interval_s: float = 1.0) -> None:
        env = os.environ if environ is None else environ
        url, job, token = (
            env.get(k, "") for k in ("ELASTRAIN_REPORT_URL", "ELASTRAIN_JOB_ID", "ELASTRAIN_REPORT_TOKEN")
        )
        self.endpoint = f"{url.rstrip('/')}/api/v1/jobs/{job}/progress" if url and job and token else ""
        self._token = token
        self.interval_s = interval_s
        self._last_time = time.monotonic()
        self._last_samples = 0
        self._latest: dict[str, Any] | None = None
        self._wake = threading.Event()
        if self.endpoint:
            threading.Thread(target=self._send_loop, name="elastrain-progress", daemon=True).start()

    @property
    def enabled(self) -> bool:
        """True inside a control-plane job."""
        return bool(self.endpoint)

    def due(self) -> bool:
        """Is a report due now? (cheap: call it every step)"""
        return self.enabled and time.monotonic() - self._last_time >= self.interval_s

    def report(
        self,
        step: int,
        epoch: int,
        world_size: int,
        samples: int,
        loss: float | None,
        hosts: list[str] | None = None,
    ) -> None:
        """Queue a report; `samples` is the running total of committed samples, `hosts` the members'."""
        now = time.monotonic()
        rate = (samples - self._last_samples) / max(now - self._last_time, 1e-9)
        self._last_time, self._last_samples = now, samples
        self._latest = {
            "step": step,
            "epoch": epoch,
            "world_size": world_size,
            "samples_per_s": round(rate, 2),
        }
        if loss is not None:
            self._latest["loss"] = float(loss)
        if hosts is not None:
            self._latest["hosts"] = hosts
        self._wake.set()

    def checkpoint(self, path: Path, manifest: Manifest, write_s: float) -> None:
        """Tell the control plane a checkpoint was published (called on the checkpoint writer thread)."""
        root = os.environ.get("ELASTRAIN_CONTAINER_ROOT", "")
        shown = str(path)
        if root and shown.startswith(root.rstrip("/") + "/"):  # as the container sees it
            shown = "/" + shown[len(root.rstrip("/")) + 1 :]
        report = {
            "path": shown,
            "step": manifest.step,
            "epoch": manifest.epoch,
            "world_size": manifest.world_size,
            "bytes": manifest.size,
            "write_s": round(write_s, 4),
        }
        self._post({"checkpoint": report})

    def _post(self, body: dict[str, Any]) -> None:
        request = urllib.request.Request(
            self.endpoint,
            data=json.dumps(body).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "X-Job-Token": self._token},
        )
        try:
            urllib.request.urlopen(request, timeout=5).close()
        except (urllib.error.URLError, OSError):
            pass  # the server may be restarting; training never waits for it

    def _send_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            body, self._latest = self._latest, None
            if body is not None:
                self._post(body)  # a failed post is dropped: the next report carries the latest values
