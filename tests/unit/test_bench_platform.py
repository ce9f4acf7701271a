"""The pure parts of `make bench-platform` (bench/platform_trace.py): the slice, the time compression,
a job's work against the simulator's speed, its range as the server reads it, the idle-GPU
accounting and the ratios. The replay itself needs a server and minutes: `make bench-platform`."""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path
from types import ModuleType

import pytest

from elastrain.errors import ConfigError
from elastrain.scheduler.simulator import model_for, to_job
from elastrain.scheduler.throughput import speedup
from elastrain.scheduler.trace import TraceJob
from elastrain.server.job_range import rank_range

BENCH = Path(__file__).resolve().parents[2] / "bench"


def load(name: str) -> ModuleType:
    """A bench module by file (bench/ is scripts, not a package; its modules import each other)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


pt = load("platform_trace")


def job(jid: str, submit: float, gpus: int, duration: float) -> TraceJob:
    return TraceJob(jid, submit, gpus, duration)


TRACE = [
    job("a", 0, 1, 30),  # too short
    job("b", 100, 2, 600),
    job("c", 50, 16, 600),  # too large
    job("d", 200, 1, 900),
    job("e", 300, 4, 50_000),  # too long
    job("f", 400, 8, 1200),
]


def test_the_slice_is_the_first_jobs_that_fit_from_the_start_in_submit_order() -> None:
    sliced = pt.select_slice(TRACE, 3, gpus=8, start_s=0, min_duration_s=60, max_duration_s=6 * 3600)
    assert [j.job_id for j in sliced] == ["b", "d", "f"]
    assert [j.job_id for j in pt.select_slice(TRACE, 2, 8, start_s=150)] == ["d", "f"]
    with pytest.raises(ConfigError, match="only 3 trace jobs"):
        pt.select_slice(TRACE, 4, 8)


def test_the_platform_floor_raises_small_jobs_to_a_launcher_and_a_worker() -> None:
    floored = pt.with_floor([job("x", 0, 1, 60), job("y", 0, 4, 60)])
    assert [(j.num_gpus, j.min_gpus) for j in floored] == [(2, 2), (4, 2)]
    assert [to_job(j, 12, 12).min_workers for j in floored] == [2, 2]
    assert [j.duration_s for j in floored] == [60, 60]


def test_compression_scales_arrivals_from_the_first_and_run_times_alike() -> None:
    out = pt.compress([job("x", 1000, 1, 600), job("y", 1600, 2, 60)], 0.01)
    assert [(j.submit_s, j.duration_s) for j in out] == [(0.0, 6.0), (pytest.approx(6.0), pytest.approx(0.6))]
    for bad in (0.0, -1.0, math.nan):
        with pytest.raises(ConfigError, match="time factor"):
            pt.compress(out, bad)


def test_the_time_factor_gives_static_the_target_makespan() -> None:
    trace = pt.with_floor(pt.select_slice(TRACE, 3, 8))
    config = pt.sim_config(8, restart_cost_s=1.0)
    factor = pt.time_factor(trace, 120.0, config)
    res = pt.run_sim(pt.compress(trace, factor), "static-backfill", config)
    assert res.last_finish_s - res.first_submit_s == pytest.approx(120.0)


@pytest.mark.parametrize("gpus", [2, 4])
def test_a_jobs_length_follows_its_workers_as_the_simulators_rate(gpus: int) -> None:
    trace_job = job("philly-00042", 0, gpus, 60.0)
    work = pt.work_for(trace_job, 12)
    assert work.model == model_for(trace_job.job_id)
    assert work.seconds_at(gpus) == pytest.approx(60.0, abs=pt.STEP_S)
    assert work.step_s(gpus) == pytest.approx(pt.STEP_S)
    for world in (2, 3, 8, 12):
        sim_rate = speedup(work.model, world, 1) / speedup(work.model, gpus, 1)
        steps = work.samples / (world * work.local_batch)
        assert steps * work.step_s(world) == pytest.approx(60.0 / sim_rate, rel=1e-6)


def test_the_jobs_range_is_the_simulators_and_the_server_reads_it_as_such() -> None:
    pr = load("platform_run")
    trace_job = pt.with_floor([job("philly-1", 0, 1, 60.0)])[0]
    low, high = pt.bounds(trace_job, 12)
    assert (low, high) == (2, 12)
    command = pr.job_command(pt.work_for(trace_job, 12), low, high)
    ranks = rank_range(command)
    assert ranks is not None and ranks.containers(1) == (2, 12)
    assert command[-8:] == pt.work_for(trace_job, 12).args()


def test_idle_gpu_seconds_count_only_while_a_job_waits() -> None:
    series = [(0.0, 2, 0), (10.0, 4, 1), (15.0, 8, 2), (20.0, 6, 1), (30.0, 6, 0)]
    # 10-15: 4 idle x 5 s; 15-20: none idle; 20-30: 2 idle x 10 s; 0-10 and 30-40: nobody waits
    assert pt.idle_while_waiting(series, 8, end_s=40.0) == pytest.approx(40.0)
    assert pt.idle_while_waiting([], 8, 10.0) == 0.0
    assert pt.idle_while_waiting([(0.0, 9, 1)], 8, 10.0) == 0.0  # never negative


def test_the_simulators_series_is_accounted_alike() -> None:
    config = pt.sim_config(4, restart_cost_s=0.0)
    # a 4-GPU job waits behind a 2-GPU one under static: 2 GPUs idle while it waits
    res = pt.run_sim([job("p", 0, 2, 10.0), job("q", 1, 4, 10.0)], "static-backfill", config)
    assert pt.idle_while_waiting(pt.sim_series(res), 4, res.last_finish_s) == pytest.approx(2 * 9.0)


def test_ratios_and_means() -> None:
    assert pt.ratio(3.0, 4.0) == 0.75
    assert pt.ratio(0.0, 0.0) == 0.0
    assert pt.ratio(1.0, 0.0) == math.inf
    assert pt.mean([1.0, 2.0, 6.0]) == 3.0
    assert pt.mean([]) == 0.0
