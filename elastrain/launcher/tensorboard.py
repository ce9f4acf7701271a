"""`elastrain run --tensorboard-dir DIR`: the job's scalars as TensorBoard event files under DIR.

One process writes them: the launcher. It is the only process that lives through every generation
(rank 0 changes host on a resize or failure, and restart mode restarts every script), it sees every
generation change first-hand (it runs the coordinator), and it needs no storage shared with the
workers' hosts. Rank 0's progress reports and `elastrain.report()` calls reach it through the
launcher's metrics relay (`elastrain.launcher.metrics_relay`); the generation changes come from the
coordinator's incident log (`elastrain.launcher.observer`).

Tags: ``loss``, ``samples_per_s``, ``world_size`` and any scalar a script reports, at the training step;
``resize/world_size``, ``resize/steps_lost``, ``resize/detect_s``, ``resize/pause_s`` (detection to the
new generation's first step, native mode), ``job/incidents`` and ``job/restarts`` at the step (or, while
no step was reported, the generation number) where the generation began.

`torch.utils.tensorboard` is imported only when a writer is made (the flag was given).
"""

from __future__ import annotations

import importlib.util
import math
import os
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from elastrain.errors import ConfigError

PROGRESS_TAGS = ("loss", "samples_per_s", "world_size")
# set by the job field `tensorboard_dir`; the default of --tensorboard-dir
TENSORBOARD_DIR_ENV = "ELASTRAIN_TENSORBOARD_DIR"


def check_tensorboard_dir(path: Path, what: str = "--tensorboard-dir") -> Path:
    """`path` made absolute, created if needed and proven writable; else a one-line `ConfigError`
    (`what`: how the user gave it)."""
    where = path.absolute()
    if importlib.util.find_spec("tensorboard") is None:
        raise ConfigError(
            f"{what} needs the tensorboard package; install it (pip install 'elastrain[tensorboard]')"
        )
    if where.exists() and not where.is_dir():
        raise ConfigError(f"{what} {path} is a file; give a directory")
    try:
        where.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=where, prefix=".elastrain-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError(
            f"{what} {path}: cannot write there ({reason}); give a directory you can write"
        ) from None
    return where


def _finite(value: Any) -> float | None:
    """`value` as a float when it is a finite number (a bool is not), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


class TensorBoardWriter:
    """Thread-safe writer of the job's scalars (``events.out.tfevents.*`` under `log_dir`)."""

    def __init__(self, log_dir: Path, flush_secs: int = 5) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir), flush_secs=flush_secs)
        self._lock = threading.Lock()
        self.last_step: int | None = None  # the newest training step reported (the x of job events)

    def progress(self, body: Mapping[str, Any], walltime: float | None = None) -> None:
        """One progress point: ``step`` plus ``loss``/``samples_per_s``/``world_size`` and ``scalars``."""
        step = body.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            step = self.last_step if self.last_step is not None else 0
        values = {tag: body.get(tag) for tag in PROGRESS_TAGS}
        extra = body.get("scalars")
        if isinstance(extra, Mapping):
            values.update({str(k): v for k, v in extra.items() if k not in PROGRESS_TAGS})
        with self._lock:
            self.last_step = max(step, self.last_step or 0)
            for tag, value in values.items():
                number = _finite(value)
                if number is not None:
                    self._writer.add_scalar(tag, number, step, walltime=walltime)

    def generation(
        self, incident: Mapping[str, Any], incidents: int, restarts: int | None, native: bool
    ) -> None:
        """A generation formed (`incident` as `rendezvous.incidents.Incident.to_dict` gives it): its world
        size, the steps it lost and the job's running counts of incidents and (restart mode) restarts."""
        step = self._event_step(incident, native)
        at = _finite(incident.get("formed_at")) or time.time()
        with self._lock:
            self._writer.add_scalar("resize/world_size", float(incident["world_size"]), step, walltime=at)
            self._writer.add_scalar("resize/steps_lost", float(incident["steps_lost"]), step, walltime=at)
            self._writer.add_scalar("resize/detect_s", float(incident["detect_s"]), step, walltime=at)
            self._writer.add_scalar("job/incidents", float(incidents), step, walltime=at)
            if restarts is not None:
                self._writer.add_scalar("job/restarts", float(restarts), step, walltime=at)
            self._writer.add_scalar("world_size", float(incident["world_size"]), step, walltime=at)

    def recovered(self, incident: Mapping[str, Any], native: bool) -> None:
        """The generation completed its first step: the training pause that resize or failure cost."""
        pause = _finite(incident.get("recover_s"))
        if pause is None:
            return
        at = _finite(incident.get("first_step_at")) or time.time()
        with self._lock:
            self._writer.add_scalar("resize/pause_s", pause, self._event_step(incident, native), walltime=at)

    def _event_step(self, incident: Mapping[str, Any], native: bool) -> int:
        if native:  # the coordinator knows the step the generation starts from
            return int(incident.get("start_step") or 0)
        return self.last_step if self.last_step is not None else int(incident.get("generation") or 0)

    def flush(self) -> None:
        """Write what is buffered to disk."""
        with self._lock:
            self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        with self._lock:
            self._writer.close()


def writer_for(environ: Mapping[str, str] | None = None) -> TensorBoardWriter | None:
    """A writer for ``ELASTRAIN_TENSORBOARD_DIR`` when set and usable (a script run without a launcher)."""
    env = os.environ if environ is None else environ
    directory = env.get(TENSORBOARD_DIR_ENV, "")
    if not directory:
        return None
    return TensorBoardWriter(check_tensorboard_dir(Path(directory)))
