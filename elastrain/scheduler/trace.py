"""Job traces for the simulator: read and validate a CSV, or repeat one to make it longer.

A trace is any CSV with at least the columns ``job_id,submit_time_s,num_gpus,duration_s``; the
optional ``min_gpus``/``max_gpus`` give a job's elastic bounds (its ``--min-np/--max-np``; empty or
absent: the simulator's default, see :func:`elastrain.scheduler.simulator.to_job`). Other columns
are ignored. A malformed file is refused with a one-line :class:`ConfigError` naming the line.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, replace
from pathlib import Path

from elastrain.errors import ConfigError

REQUIRED = ("job_id", "submit_time_s", "num_gpus", "duration_s")
OPTIONAL = ("min_gpus", "max_gpus")


@dataclass(frozen=True, slots=True)
class TraceJob:
    """One trace row: ``duration_s`` is how long the job ran with ``num_gpus`` GPUs; ``min_gpus`` /
    ``max_gpus`` are its elastic bounds when the trace gives them (0: not given)."""

    job_id: str
    submit_s: float
    num_gpus: int
    duration_s: float
    line: int = 0
    min_gpus: int = 0
    max_gpus: int = 0


def read_trace(path: str | Path) -> list[TraceJob]:
    """The jobs of a trace CSV, sorted by submit time (then file order)."""
    path = Path(path)
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    jobs: list[TraceJob] = []
    seen: set[str] = set()
    with fh:
        reader = csv.DictReader(fh)
        try:
            header = reader.fieldnames or []
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} line 1: not a CSV file ({exc})") from exc
        missing = [c for c in REQUIRED if c not in header]
        if missing:
            raise ConfigError(
                f"{path} line 1: missing column(s) {', '.join(missing)} (need {','.join(REQUIRED)})"
            )
        try:
            for row in reader:
                job = _parse_row(path, reader.line_num, row)
                if job.job_id in seen:
                    raise ConfigError(f"{path} line {reader.line_num}: duplicate job_id {job.job_id!r}")
                seen.add(job.job_id)
                jobs.append(job)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} line {reader.line_num}: unreadable CSV ({exc})") from exc
    if not jobs:
        raise ConfigError(f"{path}: the trace has no jobs")
    jobs.sort(key=lambda j: (j.submit_s, j.line))
    return jobs


def _parse_row(path: Path, line: int, row: dict[str, str | None]) -> TraceJob:
    where = f"{path} line {line}"
    values = {}
    for col in REQUIRED:
        value = row.get(col)
        if value is None or not value.strip():
            raise ConfigError(f"{where}: empty {col}")
        values[col] = value.strip()
    nums: dict[str, float] = {}
    for col in ("submit_time_s", "num_gpus", "duration_s"):
        try:
            nums[col] = float(values[col])
        except ValueError:
            raise ConfigError(f"{where}: {col} {values[col]!r} is not a number") from None
        if not math.isfinite(nums[col]) or nums[col] < 0:
            raise ConfigError(f"{where}: {col} {values[col]!r} must be a finite number >= 0")
    gpus = nums["num_gpus"]
    if gpus < 1 or gpus != int(gpus):
        raise ConfigError(f"{where}: num_gpus {values['num_gpus']!r} must be a whole number >= 1")
    bounds: list[int] = []
    for col in OPTIONAL:
        raw = (row.get(col) or "").strip()
        try:
            bound = int(raw) if raw else 0
        except ValueError:
            raise ConfigError(f"{where}: {col} {raw!r} must be a whole number") from None
        bounds.append(bound)
    low, high = bounds
    if low < 0 or high < 0 or (low and low > gpus) or (high and high < max(gpus, low)):
        raise ConfigError(f"{where}: need min_gpus <= num_gpus <= max_gpus (got {low}, {int(gpus)}, {high})")
    return TraceJob(values["job_id"], nums["submit_time_s"], int(gpus), nums["duration_s"], line, low, high)


def repeat_trace(jobs: list[TraceJob], times: int, period_s: float | None = None) -> list[TraceJob]:
    """``times`` back-to-back copies of ``jobs``, copy k shifted by k x ``period_s`` (default: the
    submit-time span rounded up to whole hours) and its ids suffixed ``#k``."""
    if times < 1:
        raise ConfigError(f"--repeat must be >= 1, not {times}")
    if times == 1:
        return list(jobs)
    if period_s is None:
        span = max(j.submit_s for j in jobs) - min(j.submit_s for j in jobs)
        period_s = math.ceil((span + 1) / 3600.0) * 3600.0
    out = list(jobs)
    for k in range(1, times):
        out.extend(replace(j, job_id=f"{j.job_id}#{k}", submit_s=j.submit_s + k * period_s) for j in jobs)
    return out


def scale_arrivals(jobs: list[TraceJob], rate: float) -> list[TraceJob]:
    """The same jobs arriving ``rate`` times as fast (0.5: half the load, 2: twice): submit times
    measured from the first are divided by ``rate``; run times and sizes stay."""
    if not math.isfinite(rate) or rate <= 0:
        raise ConfigError(f"arrival rate must be a number > 0, not {rate}")
    if not jobs:
        return []
    first = min(j.submit_s for j in jobs)
    return [replace(j, submit_s=first + (j.submit_s - first) / rate) for j in jobs]
