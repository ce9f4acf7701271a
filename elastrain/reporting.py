"""`elastrain.report(loss=..., step=..., **scalars)`: metrics from any script, elastrain's API or not.

Where the figures go is where elastrain's own loop sends its progress:

* inside a control-plane job (``ELASTRAIN_REPORT_URL``/``_JOB_ID``/``_REPORT_TOKEN``): the job's
  progress on the server (its page, ``GET /api/v1/jobs/{id}/metrics``);
* under ``elastrain run --tensorboard-dir``: the launcher's TensorBoard writer (``ELASTRAIN_METRICS_URL``);
* a script run directly with ``ELASTRAIN_TENSORBOARD_DIR`` set (a job submitted with ``tensorboard_dir``
  whose command is not ``elastrain run``): a TensorBoard writer in this process.

Elsewhere it is a no-op (one debug log line). Only rank 0 sends (elastrain's rank in a native script,
``RANK`` in a torchrun-style one), so every rank may call it. The call never blocks and never raises:
values are merged and sent by a background thread at most once per second (the server gets the
latest value of each name, TensorBoard every point, up to `MAX_BUFFERED` between two sends), and
what is still queued when the script exits is sent then (for up to 2 s). A value that is not a
finite number, or a name that is not ``[A-Za-z_][A-Za-z0-9_./-]*`` (at most 64 characters), is
dropped with a one-time warning. ``step``, ``epoch``, ``loss``, ``samples_per_s`` and ``world_size``
are the job's own figures; up to `MAX_SCALARS` other names are kept per job report.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastrain.runtime.progress import _job_endpoint, post_json, relay_endpoint

if TYPE_CHECKING:
    from elastrain.launcher.tensorboard import TensorBoardWriter

log = logging.getLogger("elastrain.report")
FIELDS = ("step", "epoch", "loss", "samples_per_s", "world_size")
INTEGER_FIELDS = ("step", "epoch", "world_size")
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_./-]{0,63}")
MAX_SCALARS = 32
MAX_BUFFERED = 1000
EXIT_FLUSH_S = 2.0
POST_TIMEOUT_S = 2.0  # a script's exit waits for the last send at most about this long


def _number(value: Any) -> float | None:
    """A finite float from a Python number or a one-element tensor/array; None otherwise."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, int | float):
        item = getattr(value, "item", None)  # torch.Tensor, numpy scalar: no import needed
        try:
            value = item() if callable(item) else value
        except (ValueError, RuntimeError):  # more than one element
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            return None
    number = float(value)
    return number if math.isfinite(number) else None


class Reporter:
    """The process's reporter: validates, batches and sends `report` calls (one per process)."""

    def __init__(self, environ: Mapping[str, str] | None = None, interval_s: float = 1.0) -> None:
        self.environ = dict(os.environ if environ is None else environ)
        self.interval_s = interval_s
        self.server, self._server_token = _job_endpoint(self.environ, "progress")
        self.relay, self._relay_token = relay_endpoint(self.environ)
        self.tensorboard_dir = "" if self.relay else self.environ.get("ELASTRAIN_TENSORBOARD_DIR", "")
        self._writer: TensorBoardWriter | None = None
        self._latest: dict[str, Any] = {}  # merged since the last send (the server's row)
        self._points: deque[dict[str, Any]] = deque(maxlen=MAX_BUFFERED)  # every point (TensorBoard)
        self._lock = threading.Lock()
        self._send_lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._warned: set[str] = set()
        self.sent = 0  # batches sent (to any destination)

    @property
    def enabled(self) -> bool:
        """Is there anywhere to send to?"""
        return bool(self.server or self.relay or self.tensorboard_dir)

    def is_rank0(self) -> bool:
        """Only rank 0 reports: elastrain's rank when this process runs its runtime, else ``RANK``."""
        connection = sys.modules.get("elastrain.runtime.connection")
        runtime = connection.current_runtime() if connection is not None else None
        if runtime is not None:
            return bool(runtime.rank == 0)
        return self.environ.get("RANK", "0").strip() in ("", "0")

    def report(self, values: Mapping[str, Any]) -> None:
        """Queue one point (non-blocking); see the module's docstring."""
        if not self.enabled or not self.is_rank0():
            return
        point = self._valid(values)
        if not point:
            return
        self._defaults(point)
        point["at"] = time.time()
        with self._lock:
            for key, value in point.items():
                if key == "scalars":
                    self._latest.setdefault("scalars", {}).update(value)
                elif key != "at":
                    self._latest[key] = value
            self._points.append(point)
            if self._thread is None:
                self._thread = threading.Thread(target=self._send_loop, name="elastrain-report", daemon=True)
                self._thread.start()
                atexit.register(self.flush, EXIT_FLUSH_S)
        self._wake.set()

    def _valid(self, values: Mapping[str, Any]) -> dict[str, Any]:
        point: dict[str, Any] = {}
        scalars: dict[str, float] = {}
        for name, value in values.items():
            number = _number(value)
            if not NAME.fullmatch(name) or number is None:
                self._warn_once(name, f"elastrain.report: {name}={value!r} dropped (give a finite number)")
                continue
            if name in INTEGER_FIELDS:
                if number < 0 or number != int(number):
                    self._warn_once(name, f"elastrain.report: {name} must be a whole number >= 0")
                    continue
                point[name] = int(number)
            elif name in FIELDS:
                point[name] = number
            elif len(scalars) < MAX_SCALARS:
                scalars[name] = number
            else:
                self._warn_once("", f"elastrain.report: at most {MAX_SCALARS} other scalars; {name} dropped")
        if scalars:
            point["scalars"] = scalars
        return point

    def _defaults(self, point: dict[str, Any]) -> None:
        """The world size, when the script did not give it (torchrun's ``WORLD_SIZE``, elastrain's)."""
        if "world_size" in point:
            return
        connection = sys.modules.get("elastrain.runtime.connection")
        runtime = connection.current_runtime() if connection is not None else None
        world = runtime.world_size if runtime is not None else self.environ.get("WORLD_SIZE", "")
        if str(world).isdigit():
            point["world_size"] = int(world)

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def flush(self, timeout_s: float = EXIT_FLUSH_S) -> bool:
        """Send what is queued now (waits up to `timeout_s` for a send in progress); True when sent."""
        if not self._send_lock.acquire(timeout=timeout_s):
            return False
        try:
            self._send_once()
            return True
        finally:
            self._send_lock.release()

    def _send_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            with self._send_lock:
                self._send_once()
            time.sleep(self.interval_s)  # the rate limit: what arrives meanwhile goes in the next batch

    def _send_once(self) -> None:
        with self._lock:
            latest, self._latest = self._latest, {}
            points = list(self._points)
            self._points.clear()
        if not points:
            return
        if self.server:  # unreachable: dropped, never raised
            post_json(self.server, self._server_token, latest, POST_TIMEOUT_S)
        if self.relay:
            post_json(self.relay, self._relay_token, {"points": points}, POST_TIMEOUT_S)
        elif self.tensorboard_dir:
            self._write_tensorboard(points)
        self.sent += 1

    def _write_tensorboard(self, points: list[dict[str, Any]]) -> None:
        try:
            if self._writer is None:
                from elastrain.launcher.attach import container_path
                from elastrain.launcher.tensorboard import TensorBoardWriter, check_tensorboard_dir

                where = Path(container_path(self.tensorboard_dir, self.environ))  # a container's path
                self._writer = TensorBoardWriter(check_tensorboard_dir(where))
            for point in points:
                self._writer.progress(point, walltime=point.get("at"))
            self._writer.flush()
        except Exception as exc:  # never into the user's script: say it once, stop trying
            self._warn_once("tensorboard", f"elastrain.report: no TensorBoard scalars ({exc})")
            self.tensorboard_dir = ""


_REPORTER: Reporter | None = None
_REPORTER_LOCK = threading.Lock()


def reporter() -> Reporter:
    """The process's reporter (made on first use, from the environment then)."""
    global _REPORTER
    with _REPORTER_LOCK:
        if _REPORTER is None:
            _REPORTER = Reporter()
            if not _REPORTER.enabled:
                log.debug(
                    "elastrain.report: not in an elastrain job (no ELASTRAIN_REPORT_URL, "
                    "ELASTRAIN_METRICS_URL or ELASTRAIN_TENSORBOARD_DIR); the figures are dropped"
                )
        return _REPORTER


def report(loss: Any = None, step: Any = None, **scalars: Any) -> None:
    """Report training figures from any script: ``elastrain.report(loss=0.4, step=100, accuracy=0.9)``.

    Sent by rank 0 only, batched (at most once a second) on a background thread, to the job's page
    and/or TensorBoard; a no-op outside an elastrain job. Never blocks, never raises.
    """
    values = dict(scalars)
    if loss is not None:
        values["loss"] = loss
    if step is not None:
        values["step"] = step
    try:
        reporter().report(values)
    except Exception:  # a metrics call must never break training
        log.debug("elastrain.report failed", exc_info=True)
