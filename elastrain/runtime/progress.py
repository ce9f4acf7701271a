"""Progress reports from a running job to the control plane (rank 0, at most once a second).

Enabled when the job was started by the control plane (`elastrain job submit` sets
ELASTRAIN_REPORT_URL, ELASTRAIN_JOB_ID and ELASTRAIN_REPORT_TOKEN: `elastrain.contracts.env.ReportEnv`),
or when ``elastrain run --tensorboard-dir`` relays them to its TensorBoard writer (it sets
``ELASTRAIN_METRICS_URL``, see `elastrain.launcher.metrics_relay`; the job token authenticates).
The payloads are `elastrain.contracts.report`'s. The HTTP post happens on a
background thread that always sends the latest values, so a slow server never slows training.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastrain.contracts.env import ReportEnv, WorkerEnv
from elastrain.contracts.report import CheckpointReport, ProgressReport
from elastrain.httpunix import urlopen

if TYPE_CHECKING:
    from elastrain.runtime.checkpoint import Manifest

METRICS_URL_ENV = "ELASTRAIN_METRICS_URL"  # the launcher's metrics relay (``--tensorboard-dir``)
RELAY_PATH = "/points"  # POST {"points": [progress body, ...]} there, header X-Job-Token


def relay_endpoint(env: Mapping[str, str]) -> tuple[str, str]:
    """``(URL of the launcher's metrics relay, job token)``; the URL is empty when there is none."""
    url, token = env.get(METRICS_URL_ENV, ""), env.get(WorkerEnv.JOB_TOKEN, "")
    return (url.rstrip("/") + RELAY_PATH, token) if url and token else ("", "")


def _job_endpoint(env: Mapping[str, str], resource: str) -> tuple[str, str]:
    """``(URL of the job's `resource`, report token)``; the URL is empty outside a control-plane job."""
    report = ReportEnv.from_env(env)
    return report.endpoint(resource), report.token


def post_json(endpoint: str, token: str, body: dict[str, Any], timeout_s: float = 5.0) -> int:
    """POST `body` as JSON; the HTTP status, or 0 when the server cannot be reached."""
    request = urllib.request.Request(
        endpoint,
        data=json.dumps(body).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "X-Job-Token": token},
    )
    try:
        with urlopen(request, timeout=timeout_s) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (urllib.error.URLError, OSError):
        return 0


_post = post_json  # its name before it was public (tests post through it)


class ProgressReporter:
    """Rate-limited, non-blocking reporter of step, epoch, loss, samples/s, world size and hosts."""

    def __init__(self, environ: dict[str, str] | None = None, interval_s: float = 1.0) -> None:
        env = os.environ if environ is None else environ
        self.endpoint, self._token = _job_endpoint(env, "progress")
        self.relay, self._relay_token = relay_endpoint(env)
        self.interval_s = interval_s
        self._last_time = time.monotonic()
        self._last_samples = 0
        self._latest: dict[str, Any] | None = None
        self._wake = threading.Event()
        if self.enabled:
            threading.Thread(target=self._send_loop, name="elastrain-progress", daemon=True).start()

    @property
    def enabled(self) -> bool:
        """True inside a control-plane job, or with the launcher's metrics relay."""
        return bool(self.endpoint or self.relay)

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
        self._latest = ProgressReport(step, epoch, world_size, round(rate, 2), loss, hosts).to_wire()
        self._wake.set()

    def checkpoint(self, path: Path, manifest: Manifest, write_s: float) -> None:
        """Tell the control plane a checkpoint was published (called on the checkpoint writer thread)."""
        root = os.environ.get(WorkerEnv.CONTAINER_ROOT, "")
        shown = str(path)
        if root and shown.startswith(root.rstrip("/") + "/"):  # as the container sees it
            shown = "/" + shown[len(root.rstrip("/")) + 1 :]
        report = CheckpointReport(
            shown, manifest.step, manifest.epoch, manifest.world_size, manifest.size, round(write_s, 4)
        )
        if self.endpoint:
            post_json(self.endpoint, self._token, report.to_wire())

    def _send_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            body, self._latest = self._latest, None
            if body is None:
                continue
            # on failure the next report carries the latest values
            if self.endpoint:
                post_json(self.endpoint, self._token, body)
            if self.relay:
                post_json(self.relay, self._relay_token, {"points": [body]})


class OrderedPoster:
    """Sends bodies to one resource of a control-plane job, in order, none dropped.

    `report` queues a body (non-blocking); a background thread posts them to
    ``/api/v1/jobs/{id}/{resource}`` and retries while the server is unreachable (it may be restarting).
    """

    def __init__(self, resource: str, environ: Mapping[str, str] | None = None, retry_s: float = 1.0) -> None:
        self.endpoint, self._token = _job_endpoint(os.environ if environ is None else environ, resource)
        self.retry_s = retry_s
        self._queue: queue.Queue[dict[str, Any]] = queue.Queue()
        if self.endpoint:
            threading.Thread(target=self._send_loop, name=f"elastrain-{resource}", daemon=True).start()

    @property
    def enabled(self) -> bool:
        """True inside a control-plane job."""
        return bool(self.endpoint)

    def report(self, body: dict[str, Any]) -> None:
        """Queue one body (non-blocking)."""
        if self.enabled:
            self._queue.put(dict(body))

    def flush(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for every queued body to be delivered; True when they were."""
        deadline = time.monotonic() + timeout_s
        while self._queue.unfinished_tasks and time.monotonic() < deadline:
            time.sleep(0.05)
        return not self._queue.unfinished_tasks

    def _send_loop(self) -> None:
        while True:
            body = self._queue.get()
            # 0: unreachable, 5xx: the server is in trouble -> retry; 2xx done; other 4xx will never work
            while (status := post_json(self.endpoint, self._token, body)) == 0 or status >= 500:
                time.sleep(self.retry_s)
            self._queue.task_done()


class IncidentReporter(OrderedPoster):
    """Sends every generation change of a control-plane job to the server, in order, none dropped.

    The launcher queues each incident once its first step is done (restart mode: once it formed); a
    background thread posts them to ``/api/v1/jobs/{id}/incidents``, retrying while the server is away.
    """

    def __init__(self, environ: Mapping[str, str] | None = None, retry_s: float = 1.0) -> None:
        super().__init__("incidents", environ, retry_s)
