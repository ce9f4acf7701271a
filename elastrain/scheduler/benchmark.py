"""The Pollux benchmark: job lists (``pollux-1.0x.csv``) and the per-model measurements that drive them.

**Job lists**: any CSV with the columns ``set,workload,job_id,submit_time_s,application,num_gpus,
batch_size`` (one row per job; a set holds workloads, a workload is one simulation).
:func:`read_benchmark` picks one set and one workload (or all of them) and refuses bad input with a
one-line :class:`~elastrain.errors.ConfigError` naming the file, the line and the fix.

**Application data** (:class:`Application`, from ``pollux_throughput/``): measured step and sync
times per placement and per-GPU batch, and gradient statistics per epoch of reference runs, used the
way the Pollux artifact's simulator uses them (``simulator/applications.py``):

* step time of a placement (GPUs per node): if that placement (up to rotation) was measured, linear
  interpolation in the per-GPU batch; otherwise linear interpolation over (nodes, replicas, per-GPU
  batch) across the measured placements averaged per key plus the scalability rows (scipy's
  ``LinearNDInterpolator``; nodes capped at 16);
* gradient statistics of a global batch in an epoch: linear interpolation between the two measured
  batch sizes around it; progress needed to finish epoch ``e``: the smallest cumulative progress of
  the reference runs after ``e`` epochs (units: steps at the smallest batch ``M0``);
* limits: ``M0`` and the largest batch are the smallest and largest measured batch sizes, the
  per-GPU batch range is the measured one (yolov3: at most 8), a job ends after its model's target
  epochs (:data:`MAX_EPOCHS`).

Nothing is read at import time.
"""

from __future__ import annotations

import bisect
import csv
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastrain.errors import ConfigError
from elastrain.scheduler.goodput import GradParams, PerfParams, fit_perf_params

LIST_COLUMNS = ("set", "workload", "job_id", "submit_time_s", "application", "num_gpus", "batch_size")
STEP_COLUMNS = (
    "model",
    "source",
    "placement",
    "num_nodes",
    "num_replicas",
    "local_bsz",
    "step_time_s",
    "sync_time_s",
)
GRAD_COLUMNS = ("model", "batch_size", "progress", "grad_sqr", "grad_var")
MAX_EPOCHS = {"bert": 2, "cifar10": 100, "deepspeech2": 80, "imagenet": 90, "ncf": 10, "yolov3": 50}
MAX_LOCAL_BSZ = {"yolov3": 8}  # the artifact's override of the measured range
FIXED_BATCH = {"ncf": 32768}  # the artifact runs ncf at this batch on one GPU even under Pollux
ALL = "all"


@dataclass(frozen=True, slots=True)
class BenchmarkJob:
    """One row of a benchmark list: the job's model and its tuned size and batch."""

    job_id: str
    submit_s: float
    application: str
    num_gpus: int
    batch_size: int
    workload: str = ""
    line: int = 0
    set_name: str = ""


def read_benchmark(path: str | Path, set_name: str | None, workload: str) -> dict[str, list[BenchmarkJob]]:
    """``{workload: jobs sorted by submit time}`` of ``set_name`` (None: the file's only set);
    ``workload`` is one name or ``all``."""
    path = Path(path)
    try:
        fh = path.open(newline="", encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read benchmark list {path}: {exc.strerror or exc}") from exc
    sets: dict[str, dict[str, list[BenchmarkJob]]] = defaultdict(lambda: defaultdict(list))
    with fh:
        reader = csv.DictReader(fh)
        try:
            header = reader.fieldnames or []
            missing = [c for c in LIST_COLUMNS if c not in header]
            if missing:
                raise ConfigError(
                    f"{path} line 1: missing column(s) {', '.join(missing)} (need {','.join(LIST_COLUMNS)})"
                )
            for row in reader:
                job = _parse_row(path, reader.line_num, row)
                sets[job.set_name][job.workload].append(job)
        except (csv.Error, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path} line {reader.line_num}: unreadable CSV ({exc})") from exc
    known = ", ".join(sorted(sets)) or "none"
    if set_name is None:
        if len(sets) != 1:
            raise ConfigError(f"{path}: choose a set with --set (sets in the file: {known})")
        set_name = next(iter(sets))
    if set_name not in sets:
        raise ConfigError(f"{path}: no set {set_name!r} (--set; sets in the file: {known})")
    out = sets[set_name]
    if workload != ALL:
        if workload not in out:
            raise ConfigError(
                f"{path}: set {set_name!r} has no workload {workload!r} "
                f"(--workload; choose from {', '.join(sorted(out, key=_natural))} or all)"
            )
        out = {workload: out[workload]}
    result = {}
    for name in sorted(out, key=_natural):
        jobs = out[name]
        seen: set[str] = set()
        for job in jobs:
            if job.job_id in seen:
                raise ConfigError(f"{path} line {job.line}: duplicate job_id {job.job_id!r} in {name}")
            seen.add(job.job_id)
        result[name] = sorted(jobs, key=lambda j: (j.submit_s, j.line))
    return result


def _natural(name: str) -> tuple[str, int]:
    """Sort ``workload-10`` after ``workload-9``."""
    head, _, tail = name.rpartition("-")
    return (head, int(tail)) if tail.isdigit() else (name, 0)


def _parse_row(path: Path, line: int, row: dict[str, Any]) -> BenchmarkJob:
    where = f"{path} line {line}"
    vals = {}
    for col in LIST_COLUMNS:
        value = (row.get(col) or "").strip()
        if not value:
            raise ConfigError(f"{where}: empty {col}")
        vals[col] = value
    try:
        submit = float(vals["submit_time_s"])
    except ValueError:
        raise ConfigError(f"{where}: submit_time_s {vals['submit_time_s']!r} is not a number") from None
    if not submit >= 0 or submit == float("inf"):
        raise ConfigError(f"{where}: submit_time_s {vals['submit_time_s']!r} must be a finite number >= 0")
    ints = {}
    for col in ("num_gpus", "batch_size"):
        try:
            ints[col] = int(vals[col])
        except ValueError:
            raise ConfigError(f"{where}: {col} {vals[col]!r} must be a whole number >= 1") from None
        if ints[col] < 1:
            raise ConfigError(f"{where}: {col} {vals[col]!r} must be a whole number >= 1")
    return BenchmarkJob(
        vals["job_id"],
        submit,
        vals["application"],
        ints["num_gpus"],
        ints["batch_size"],
        vals["workload"],
        line,
        vals["set"],
    )


class Application:
    """Measured behaviour of one benchmark model (see the module docstring)."""

    def __init__(
        self,
        name: str,
        steps: list[dict[str, str]],
        grads: dict[int, list[tuple[float, float, float]]],
    ) -> None:
        self.name = name
        placed: dict[tuple[int, ...], dict[float, list[tuple[float, float]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        self._points: list[tuple[float, float, float, float, float]] = []
        self._profile: list[tuple[float, float, float, float, float]] = []
        by_key: dict[tuple[int, int, float], list[tuple[float, float]]] = defaultdict(list)
        for r in steps:
            bsz, step, sync = float(r["local_bsz"]), float(r["step_time_s"]), float(r["sync_time_s"])
            self._profile.append((float(r["num_nodes"]), float(r["num_replicas"]), bsz, step - sync, step))
            if r["source"] == "placements":
                counts = _rotation(tuple(int(c) for c in r["placement"]))
                placed[counts][bsz].append((step, sync))
                by_key[(len(counts), sum(counts), bsz)].append((step, sync))
            else:
                self._points.append((float(r["num_nodes"]), float(r["num_replicas"]), bsz, step, sync))
        if not placed or not grads:
            raise ConfigError(f"model {name}: needs placement step times and gradient statistics")
        for (n, k, b), vals in by_key.items():
            self._points.append((n, k, b, *_mean(vals)))
        self._placed = {c: sorted((b, *_mean(v)) for b, v in d.items()) for c, d in placed.items()}
        local = sorted({b for d in placed.values() for b in d})
        self.min_local_bsz = int(local[0])
        self.max_local_bsz = MAX_LOCAL_BSZ.get(name, int(local[-1]))
        self._grads = dict(sorted(grads.items()))
        self._batches = list(self._grads)
        self.init_batch_size, self.max_batch_size = self._batches[0], self._batches[-1]
        self.max_epochs = min(MAX_EPOCHS.get(name, 10**9), *(len(v) for v in self._grads.values()))
        self._progress = [min(v[e][0] for v in self._grads.values()) for e in range(self.max_epochs)]
        self._interp: Callable[[list[list[float]]], Any] | None = None
        self._memo: dict[tuple[tuple[int, ...], float], tuple[float, float]] = {}
        self._perf: PerfParams | None = None

    def perf_params(self) -> PerfParams:
        """Pollux's step-time model fitted to all of this model's measurements (a fully profiled job;
        computed once, on first use)."""
        if self._perf is None:
            self._perf = fit_perf_params(self._profile)
        return self._perf

    def progress(self, epoch: int) -> float:
        """Cumulative progress (reference steps) at the end of ``epoch`` epochs (0 for epoch 0)."""
        return 0.0 if epoch <= 0 else self._progress[min(epoch, self.max_epochs) - 1]

    def grad_stats(self, batch_size: float, epoch: int) -> GradParams:
        """Gradient statistics during ``epoch`` (0-based) at global batch ``batch_size``, interpolated
        linearly between the measured batch sizes around it (clamped to the measured range)."""
        e = min(max(epoch, 0), self.max_epochs - 1)
        bs = min(max(batch_size, self.init_batch_size), self.max_batch_size)
        i = bisect.bisect_left(self._batches, bs)
        hi = self._batches[i]
        if hi == bs or i == 0:
            _, sqr, var = self._grads[hi][e]
            return GradParams(sqr, var)
        lo = self._batches[i - 1]
        w = (bs - lo) / (hi - lo)
        (_, s0, v0), (_, s1, v1) = self._grads[lo][e], self._grads[hi][e]
        return GradParams(s0 + w * (s1 - s0), v0 + w * (v1 - v0))

    def step_time(self, counts: tuple[int, ...], local_bsz: float) -> tuple[float, float]:
        """``(step_time_s, sync_time_s)`` of one micro-batch step with GPUs per node ``counts``."""
        counts = _rotation(tuple(c for c in counts if c > 0))
        key = (counts, float(local_bsz))
        hit = self._memo.get(key)
        if hit is None:
            hit = self._memo[key] = self._lookup(counts, float(local_bsz))
        return hit

    def _lookup(self, counts: tuple[int, ...], bsz: float) -> tuple[float, float]:
        rows = self._placed.get(counts)
        if rows is not None:
            return _interp1(rows, bsz)
        if self._interp is None:
            self._interp = _nd_interpolator(self._points)
        nodes, reps = min(len(counts), 16), sum(counts)
        step, sync = (float(v) for v in self._interp([[nodes, reps, bsz]])[0])
        if step != step:  # outside the measured hull: clamp the batch into the measured range
            clamped = min(max(bsz, self.min_local_bsz), max(r[2] for r in self._points))
            step, sync = (float(v) for v in self._interp([[nodes, reps, clamped]])[0])
            if step != step:
                raise ConfigError(f"model {self.name}: no step time for {reps} GPUs on {nodes} nodes")
        return step, sync


def _rotation(counts: tuple[int, ...]) -> tuple[int, ...]:
    """The lexicographically smallest rotation (the artifact's placement key)."""
    return min((counts[i:] + counts[:i] for i in range(len(counts))), default=())


def _mean(vals: list[tuple[float, float]]) -> tuple[float, float]:
    return sum(v[0] for v in vals) / len(vals), sum(v[1] for v in vals) / len(vals)


def _interp1(rows: list[tuple[float, float, float]], x: float) -> tuple[float, float]:
    """Linear interpolation of (step, sync) in the batch (clamped at the measured ends)."""
    xs = [r[0] for r in rows]
    i = bisect.bisect_left(xs, x)
    if i == 0:
        return rows[0][1], rows[0][2]
    if i == len(rows):
        return rows[-1][1], rows[-1][2]
    (x0, a0, b0), (x1, a1, b1) = rows[i - 1], rows[i]
    w = (x - x0) / (x1 - x0)
    return a0 + w * (a1 - a0), b0 + w * (b1 - b0)


def _nd_interpolator(
    points: list[tuple[float, float, float, float, float]],
) -> Callable[[list[list[float]]], Any]:
    try:
        from scipy.interpolate import LinearNDInterpolator
    except ImportError:
        raise ConfigError("benchmark mode needs scipy for unmeasured placements: pip install scipy") from None
    try:
        return LinearNDInterpolator([p[:3] for p in points], [p[3:] for p in points])
    except Exception as exc:  # scipy's QhullError: too few or degenerate measurements
        raise ConfigError(
            f"cannot interpolate step times over the measurements ({exc.__class__.__name__})"
        ) from None


def load_applications(folder: str | Path, names: set[str] | None = None) -> dict[str, Application]:
    """The models in ``folder`` (``step_times.csv`` and ``grad_stats.csv``), optionally only ``names``;
    a name with no data there is an error naming the models that have some."""
    folder = Path(folder)
    steps = _read(folder / "step_times.csv", STEP_COLUMNS)
    grad_rows = _read(folder / "grad_stats.csv", GRAD_COLUMNS)
    by_model: dict[str, list[dict[str, str]]] = defaultdict(list)
    for r in steps:
        by_model[r["model"]].append(r)
    grads: dict[str, dict[int, list[tuple[float, float, float]]]] = defaultdict(lambda: defaultdict(list))
    for r in grad_rows:
        grads[r["model"]][int(r["batch_size"])].append(
            (float(r["progress"]), float(r["grad_sqr"]), float(r["grad_var"]))
        )
    known = sorted(set(by_model) & set(grads))
    wanted = sorted(names) if names is not None else known
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise ConfigError(
            f"no measurements for application(s) {', '.join(unknown)} in {folder} "
            f"(known: {', '.join(known) or 'none'}; fix the list's application column or --app-data)"
        )
    return {n: Application(n, by_model[n], grads[n]) for n in wanted}


def _read(path: Path, columns: tuple[str, ...]) -> list[dict[str, str]]:
    try:
        with path.open(newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            header = reader.fieldnames or []
            missing = [c for c in columns if c not in header]
            if missing:
                raise ConfigError(f"{path} line 1: missing column(s) {', '.join(missing)} (--app-data)")
            rows = list(reader)
            for r in rows:
                for c in columns[3:]:
                    float(r[c])
            return rows
    except OSError as exc:
        raise ConfigError(
            f"cannot read {path}: {exc.strerror or exc} (--app-data: the pollux_throughput folder)"
        ) from exc
    except (csv.Error, ValueError, TypeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: unreadable measurements ({exc})") from exc
