"""Benchmark mode: the Pollux evaluation (OSDI'21 artifact) replayed through our policies.

Jobs come from a benchmark list (:func:`elastrain.scheduler.benchmark.read_benchmark`) and progress
in epochs of their model (:class:`~elastrain.scheduler.benchmark.Application`), as in the artifact's
``simulator/simulator.py``:

* **Timing**: the policy runs on a fixed grid of ``interval_s`` (60 s): a job submitted between two
  grid points is first seen at the next one, and a finished job holds its GPUs until then (its JCT
  is its exact finish time). Every (re)allocation — first start, resize, resume — costs
  ``restart_cost_s`` (30 s) without progress while the GPUs are held.
* **Progress**: with per-GPU batch ``m``, ``s`` accumulation steps and global batch ``M`` on the
  job's placement, one optimizer step takes ``T = step + s * (step - sync)`` (measured, see
  :meth:`Application.step_time`) and is worth ``gain = (var + sqr) / (var / (M/M0) + sqr)``
  reference steps (gradient statistics of the current epoch at ``M``); progress advances at
  ``gain / T`` per second; an epoch ends at its reference progress, and the job ends after its
  model's target epochs.
* **Batch sizes**: *fixed* jobs (the baselines, like the artifact's "TunedJobs") keep the list's
  global batch, split over the GPUs they get; *adaptive* jobs (``elastic``, as Pollux) run, after
  every (re)allocation and every epoch, the per-GPU batch and accumulation steps that maximise
  Pollux's fitted goodput model (:mod:`elastrain.scheduler.goodput`) with their latest gradient
  statistics. The elastic policy plans with the same model through
  :class:`~elastrain.scheduler.goodput.GoodputSpeed` (its injectable speed function), so no policy
  is forked; with ``restart_penalty`` (default) that speed carries Pollux's restart penalty (a
  running job's goodput at another allocation is scaled by ``(age - restarts x 30 s) / (age + 30 s)``),
  so young jobs are not resized for small gains. As in the artifact, ncf keeps batch 32768 on one GPU.
* **Bounds**: fixed-size policies start a job at the list's GPU count; an elastic job may run on 1
  GPU up to ``max_batch / min_local_batch`` GPUs (fixed batch: ``batch / min_local_batch``), at most
  the cluster.

The result is a :class:`~elastrain.scheduler.simulator.SimResult` (so :func:`summarize` applies);
its per-job run time (for slowdown and useful-work utilisation) is the job's isolated run time at
its list size and batch, packed on the fewest nodes, without restarts.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence

from elastrain.errors import ConfigError
from elastrain.scheduler.api import ClusterState, DecisionKind, Finish, Job, Policy, apply
from elastrain.scheduler.benchmark import FIXED_BATCH, Application, BenchmarkJob
from elastrain.scheduler.elastic import ElasticPolicy
from elastrain.scheduler.goodput import GoodputModel, GoodputSpeed, JobGoodput, gain
from elastrain.scheduler.registry import make_policy
from elastrain.scheduler.simulator import ProgressFn, SimConfig, SimResult, SimulationError

BATCH_MODES = ("auto", "fixed", "adaptive")


def benchmark_policy(name: str, speed: GoodputSpeed, tiresias_threshold_gpu_h: float | None = None) -> Policy:
    """A policy by name; ``elastic`` plans with the goodput ``speed``."""
    if name == "elastic":
        return ElasticPolicy(speed=speed)
    return make_policy(name, tiresias_threshold_gpu_h)


class _Run:
    """Per-job bookkeeping the policy never sees."""

    __slots__ = (
        "accum",
        "app",
        "atomic",
        "bj",
        "completion",
        "counts",
        "epoch",
        "fixed",
        "held_s",
        "nodes",
        "progress",
        "rescale",
        "start",
    )

    def __init__(self, bj: BenchmarkJob, app: Application, fixed: int) -> None:
        self.bj, self.app, self.fixed = bj, app, fixed
        self.epoch, self.progress = 0, 0.0
        self.atomic, self.accum = 0, 0
        self.counts: tuple[int, ...] = ()
        self.nodes = 0
        self.rescale, self.held_s = 0.0, 0.0
        self.start: float | None = None
        self.completion: float | None = None

    @property
    def replicas(self) -> int:
        return sum(self.counts)

    @property
    def batch_size(self) -> int:
        return self.replicas * self.atomic * (self.accum + 1)

    def info(self) -> JobGoodput:
        """What the job reports: its model with the gradient statistics of its current epoch."""
        app = self.app
        batch = self.batch_size or self.fixed or app.init_batch_size
        model = GoodputModel(app.perf_params(), app.grad_stats(batch, self.epoch), app.init_batch_size)
        return JobGoodput(model, app.max_batch_size, (app.min_local_bsz, app.max_local_bsz), self.fixed)

    def rate(self) -> float:
        """True progress (reference steps) per second at the current configuration."""
        step, sync = self.app.step_time(self.counts, self.atomic)
        t_iter = step + self.accum * (step - sync)
        grad = self.app.grad_stats(self.batch_size, self.epoch)
        return gain(grad, self.batch_size, self.app.init_batch_size) / t_iter


def isolated_run_s(bj: BenchmarkJob, app: Application, gpus_per_node: int) -> float:
    """Seconds the job needs alone at its list size and batch, packed on the fewest nodes."""
    run = _Run(bj, app, bj.batch_size)
    full, rest = divmod(bj.num_gpus, gpus_per_node)
    run.counts = tuple([gpus_per_node] * full + ([rest] if rest else []))
    run.nodes = len(run.counts)
    cfg = run.info().config(run.nodes, run.replicas)
    run.atomic, run.accum = cfg.atomic_bsz, cfg.accum_steps
    total = 0.0
    for epoch in range(app.max_epochs):
        run.epoch = epoch
        total += (app.progress(epoch + 1) - app.progress(epoch)) / run.rate()
    return total


def _advance(run: _Run, t0: float, t1: float, speed: GoodputSpeed) -> float:
    """Progress from ``t0`` to ``t1`` (see the module docstring); returns the seconds stalled."""
    seconds = t1 - t0
    run.held_s += seconds
    stall = min(run.rescale, seconds)
    run.rescale -= stall
    seconds -= stall
    now = t0 + stall
    app = run.app
    while seconds > 1e-9 and run.completion is None:
        rate = run.rate()
        target = app.progress(run.epoch + 1)
        if run.progress + rate * seconds < target:
            run.progress += rate * seconds
            break
        dt = (target - run.progress) / rate
        run.epoch += 1
        run.progress = target
        now += dt
        seconds -= dt
        if run.epoch >= app.max_epochs:
            run.completion = now
        else:
            _configure(run, speed)
    return stall


def _configure(run: _Run, speed: GoodputSpeed) -> None:
    """Report the job's statistics and pick its batch for its current placement."""
    speed.set(run.bj.job_id, run.info())
    cfg = speed.config(run.bj.job_id, run.replicas, run.nodes)
    run.atomic, run.accum = cfg.atomic_bsz, cfg.accum_steps


def _to_job(bj: BenchmarkJob, app: Application, fixed: int, gpus: int, pinned: bool) -> Job:
    """The scheduler's view: list size requested, 1 .. (batch / min per-GPU batch) GPUs (``pinned``:
    1, the artifact's ncf under Pollux)."""
    cap = 1 if pinned else (fixed or app.max_batch_size) // app.min_local_bsz
    high = max(bj.num_gpus, min(max(cap, 1), gpus))
    return Job(
        id=bj.job_id,
        min_workers=1,
        max_workers=high,
        requested_workers=bj.num_gpus,
        arrival_s=bj.submit_s,
        model=bj.application,
    )


def simulate_benchmark(
    jobs: Sequence[BenchmarkJob],
    apps: dict[str, Application],
    policy_name: str,
    config: SimConfig,
    batch_mode: str = "auto",
    tiresias_threshold_gpu_h: float | None = None,
    progress: ProgressFn | None = None,
    restart_penalty: bool = True,
) -> SimResult:
    """Run one benchmark workload through one policy (see the module docstring). ``batch_mode``:
    ``fixed``, ``adaptive``, or ``auto`` (adaptive for ``elastic``, fixed for the others)."""
    if batch_mode not in BATCH_MODES:
        raise ConfigError(f"unknown batch mode {batch_mode!r}; choose from {', '.join(BATCH_MODES)}")
    adaptive = batch_mode == "adaptive" or (batch_mode == "auto" and policy_name == "elastic")
    speed = GoodputSpeed(restart_penalty_s=config.restart_cost_s if restart_penalty else 0.0)
    policy = benchmark_policy(policy_name, speed, tiresias_threshold_gpu_h)
    wall0, cpu0 = time.perf_counter(), time.process_time()
    res = SimResult(policy=policy.name, gpus=config.gpus)
    runs: dict[str, _Run] = {}
    pending = sorted(jobs, key=lambda j: j.submit_s)
    for bj in pending:
        if bj.application not in apps:
            raise ConfigError(f"job {bj.job_id} (line {bj.line}): no measurements for {bj.application!r}")
        if bj.num_gpus > config.gpus:
            raise ConfigError(
                f"job {bj.job_id} (line {bj.line}) needs {bj.num_gpus} GPUs; the cluster has {config.gpus}"
            )
    if not pending:
        return res
    grid = config.interval_s
    state = ClusterState.empty(config.gpus, config.gpus_per_node)
    active: dict[str, _Run] = {}
    total, i, done = len(pending), 0, 0
    res.first_submit_s = pending[0].submit_s
    prev = now = max(grid, math.ceil(pending[0].submit_s / grid) * grid)
    while done < total:
        for run in active.values():
            res.gpu_seconds += run.replicas * (now - prev)
            res.stall_gpu_seconds += run.replicas * _advance(run, prev, now, speed)
        state = state.with_time(now)
        ended = [jid for jid, r in active.items() if r.completion is not None]
        if ended:
            state = apply(state, [Finish(jid, reason="completed") for jid in ended])
            for jid in ended:
                run = active.pop(jid)
                finish = run.completion if run.completion is not None else now
                res.jct_s.append(finish - run.bj.submit_s)
                res.queue_s.append((run.start if run.start is not None else finish) - run.bj.submit_s)
                res.wait_s.append(max(0.0, res.jct_s[-1] - (run.held_s - (now - finish))))
                iso = isolated_run_s(run.bj, run.app, config.gpus_per_node)
                res.duration_s.append(iso)
                res.work_gpu_seconds += iso * run.bj.num_gpus
                res.last_finish_s = max(res.last_finish_s, finish)
                speed.forget(jid)
            done += len(ended)
        arrivals = []
        while i < total and pending[i].submit_s <= now:
            bj = pending[i]
            app = apps[bj.application]
            fixed = bj.batch_size if not adaptive else FIXED_BATCH.get(bj.application, 0)
            run = runs[bj.job_id] = _Run(bj, app, fixed)
            speed.set(bj.job_id, run.info())
            pinned = adaptive and bj.application in FIXED_BATCH
            arrivals.append(_to_job(bj, app, fixed, config.gpus, pinned))
            i += 1
        if arrivals:
            state = state.with_arrivals(arrivals)
        if state.running or state.queued:
            speed.now_s = now
            decisions = policy.decide(state)
            res.decide_calls += 1
            if decisions:
                state = apply(state, decisions)
                placed = {j.id: j for j in state.running}
                for d in decisions:
                    if d.kind in (DecisionKind.WAIT, DecisionKind.FINISH):
                        continue
                    run = runs[d.job_id]
                    job = placed.get(d.job_id)
                    if job is None:
                        res.preemptions += 1
                        active.pop(d.job_id, None)
                        run.counts, run.nodes, run.atomic, run.accum = (), 0, 0, 0
                        continue
                    if d.kind is DecisionKind.START:
                        if run.start is not None:
                            speed.restarted(d.job_id)
                        run.start = now if run.start is None else run.start
                        active[d.job_id] = run
                    else:
                        res.resizes += 1
                        speed.restarted(d.job_id)
                    run.counts = tuple(w * job.gpus_per_worker for _, w in job.placement)
                    run.nodes = len(run.counts)
                    run.rescale = config.restart_cost_s
                    _configure(run, speed)
            if not active and state.queued:
                raise SimulationError(
                    f"policy {policy.name} left {len(state.queued)} job(s) queued on an idle cluster "
                    f"(first: {state.queued[0].id})"
                )
        used = sum(r.replicas for r in active.values())
        if not res.series_t or res.series_gpus[-1] != used or res.series_queue[-1] != len(state.queued):
            res.series_t.append(now)
            res.series_gpus.append(used)
            res.series_queue.append(len(state.queued))
        if progress is not None:
            progress(done, total)
        prev = now
        if not active and not state.queued and i < total:
            now = max(now + grid, math.ceil(pending[i].submit_s / grid) * grid)
            prev = now
        else:
            now += grid
    res.wall_s = time.perf_counter() - wall0
    res.cpu_s = time.process_time() - cpu0
    return res
