"""Throughput model: how fast a job runs on K GPUs, relative to some other K.

The model is the Pollux (OSDI'21) step-time form, fitted per model to the measured step times in
``../shared/traces/pollux_throughput/step_times.csv`` (6 models, T4 GPUs, up to 64 GPUs)::

    T_compute(m) = a_c + b_c * m                       (m = per-GPU batch size)
    T_sync(K)    = a_r + b_r * max(K - 2, 0)  on one node (0 for K = 1)
                 = a_n + b_n * max(K - 2, 0)  across nodes
    T_step(K, m) = (T_compute^g + T_sync^g)^(1/g)        g in [1, 10]

(the two sync lines are Pollux's ``goodput.py``). **Placement-aware**: which sync line applies is
decided by the number of nodes the job actually spans (its placement), never by an assumed node
size; the simulator's progress and the policies' speed estimates both call :func:`job_speed` with
the placement's node count, so the policy plans with exactly the speed the job will run at. With a
fixed per-GPU batch ``m_ref`` (the median measured local batch of that model), K GPUs process
``K * m_ref / T_step(K, m_ref)`` samples/s; :func:`speedup` is that divided by the 1-GPU rate. The
statistical efficiency of the larger global batch is not modelled (Pollux's "goodput" would lower
the gain); the curve is the system throughput only.

The fitted parameters live in :mod:`elastrain.scheduler.fitted_params` (generated, committed), so
nothing here reads the shared folder at run time. Refit with::

    python -m elastrain.scheduler.throughput ../shared/traces/pollux_throughput/step_times.csv

A job's measured samples/s per world size (``Job.throughput``) overrides the model: a measured
world size is used as is; an unmeasured one is the model scaled by the nearest measured point.
"""

from __future__ import annotations

import csv
import math
import sys
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.errors import ConfigError

if TYPE_CHECKING:
    from elastrain.scheduler.api import Job

PARAMS_MODULE = Path(__file__).with_name("fitted_params.py")
PARAM_NAMES = ("a_c", "b_c", "a_r", "b_r", "a_n", "b_n", "g", "m_ref")


def step_time(params: dict[str, float], k: int, m: float, nodes: int) -> float:
    """Seconds per step on ``k`` GPUs spread over ``nodes`` nodes at per-GPU batch ``m`` under the
    fitted Pollux form."""
    t_compute = params["a_c"] + params["b_c"] * m
    if k <= 1:
        return t_compute
    a, b = (params["a_r"], params["b_r"]) if nodes <= 1 else (params["a_n"], params["b_n"])
    t_sync = a + b * max(k - 2, 0)
    g = params["g"]
    return float((t_compute**g + t_sync**g) ** (1.0 / g))


def model_names() -> tuple[str, ...]:
    """The models with fitted parameters, sorted."""
    from elastrain.scheduler.fitted_params import PARAMS

    return tuple(sorted(PARAMS))


@cache
def speedup(model: str, k: int, nodes: int = 1) -> float:
    """Samples/s on ``k`` GPUs over ``nodes`` nodes divided by samples/s on 1 GPU (0.0 for k <= 0).

    An unknown or empty model name uses the mean of the fitted models' curves.
    """
    if k <= 0:
        return 0.0
    from elastrain.scheduler.fitted_params import PARAMS

    nodes = max(1, min(nodes, k))
    if model not in PARAMS:
        return sum(speedup(name, k, nodes) for name in PARAMS) / len(PARAMS)
    p = PARAMS[model]
    m = p["m_ref"]
    return (k * m / step_time(p, k, m, nodes)) / (m / step_time(p, 1, m, 1))


def job_speed(job: Job, workers: int, nodes: int = 1) -> float:
    """Throughput of ``job`` with ``workers`` workers spread over ``nodes`` nodes, in the job's units.

    Measured samples/s (``job.throughput``, reported by the control plane's single-node jobs) when
    that world size was measured; else the model curve (GPUs = workers x gpus_per_worker) scaled to
    the nearest measured world size, or, with no measurement, in units of one GPU's throughput.
    This one function drives both the policies' estimates and the simulator's progress.
    """
    if workers <= 0:
        return 0.0
    gpus = workers * job.gpus_per_worker
    if not job.throughput:
        return speedup(job.model, gpus, nodes)
    measured = dict(job.throughput)
    if workers in measured:
        return measured[workers]
    ref = min(measured, key=lambda w: (abs(w - workers), w))
    base = speedup(job.model, ref * job.gpus_per_worker, 1)
    return measured[ref] * speedup(job.model, gpus, nodes) / base if base > 0 else 0.0


# ---------------------------------------------------------------- fitting (offline, rerunnable)


def _read_step_times(path: Path) -> dict[str, list[tuple[int, int, float, float]]]:
    rows: dict[str, list[tuple[int, int, float, float]]] = defaultdict(list)
    try:
        with path.open(newline="") as fh:
            for rec in csv.DictReader(fh):
                rows[rec["model"]].append(
                    (
                        int(rec["num_replicas"]),
                        int(rec["num_nodes"]),
                        float(rec["local_bsz"]),
                        float(rec["step_time_s"]),
                    )
                )
    except (OSError, KeyError, ValueError) as exc:
        raise ConfigError(f"cannot read step times from {path}: {exc}") from exc
    return rows


def fit_model(samples: Sequence[tuple[int, int, float, float]]) -> dict[str, float]:
    """Least-squares fit (on log step time) of the Pollux form to (K, nodes, m, step_time_s) samples."""
    import numpy as np
    from scipy.optimize import least_squares

    data = np.asarray(samples, dtype=float)
    k, nodes, m, t = data[:, 0], data[:, 1], data[:, 2], data[:, 3]

    def predict(x: np.ndarray) -> np.ndarray:
        a_c, b_c, a_r, b_r, a_n, b_n, g = x
        comp = a_c + b_c * m
        extra = np.maximum(k - 2, 0)
        sync = np.where(nodes > 1, a_n + b_n * extra, a_r + b_r * extra)
        sync = np.where(k > 1, sync, 0.0)
        return np.asarray((comp**g + sync**g) ** (1.0 / g))

    def residual(x: np.ndarray) -> np.ndarray:
        return np.asarray(np.log(predict(x)) - np.log(t))

    best = None
    for g0 in (1.0, 2.0, 5.0):
        sync0 = float(np.median(t)) * 0.1
        x0 = np.array([max(t.min() * 0.5, 1e-4), float(np.median(t / m)) * 0.5, sync0, 1e-3, sync0, 1e-3, g0])
        lower = [1e-6, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
        upper = [np.inf] * 6 + [10.0]
        res = least_squares(residual, x0, bounds=(lower, upper))
        if best is None or res.cost < best.cost:
            best = res
    assert best is not None
    fitted = dict(zip(PARAM_NAMES[:-1], (float(v) for v in best.x)))
    fitted["m_ref"] = float(np.median(m))
    fitted["log_rmse"] = float(np.sqrt(np.mean(best.fun**2)))
    return fitted


def refit(step_times_csv: Path, out: Path = PARAMS_MODULE) -> dict[str, dict[str, float]]:
    """Fit every model in ``step_times_csv`` and write the generated parameter module ``out``."""
    fitted = {name: fit_model(rows) for name, rows in sorted(_read_step_times(step_times_csv).items())}
    lines = [
        '"""Fitted Pollux step-time parameters per model. GENERATED by',
        "`python -m elastrain.scheduler.throughput STEP_TIMES_CSV`; do not edit.",
        "",
        f"Source: {step_times_csv.name} (Pollux OSDI'21 artifact measurements, T4 GPUs).",
        '"""',
        "",
        "PARAMS: dict[str, dict[str, float]] = {",
    ]
    for name, p in fitted.items():
        body = ", ".join(f'"{key}": {_fmt(p[key])}' for key in (*PARAM_NAMES, "log_rmse"))
        lines.append(f'    "{name}": {{{body}}},')
    lines.append("}")
    out.write_text("\n".join(lines) + "\n")
    speedup.cache_clear()
    return fitted


def _fmt(value: float) -> str:
    return repr(float(f"{value:.6g}")) if math.isfinite(value) else "0.0"


def main(argv: list[str] | None = None) -> int:
    """``python -m elastrain.scheduler.throughput STEP_TIMES_CSV``: refit and print the speedups."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m elastrain.scheduler.throughput STEP_TIMES_CSV", file=sys.stderr)
        return 2
    fitted = refit(Path(args[0]))
    for name, p in fitted.items():
        curve = " ".join(f"{k}:{speedup(name, k, -(-k // 8)):.2f}" for k in (1, 2, 4, 8, 16, 32, 64))
        print(f"{name:12s} g={p['g']:.2f} log-rmse={p['log_rmse']:.3f} speedup {curve}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
