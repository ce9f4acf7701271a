"""Elastic GPU scheduler: policies as pure functions of the cluster state, and a trace simulator.

* :mod:`~elastrain.scheduler.api` — ``Node``, ``Job``, ``ClusterState``, the ``Policy`` ABC and
  ``apply`` (the one place the inventory changes; it validates every decision); the decisions
  (``Start``, ``Grow``, ``Shrink``, ``PreemptToMin``, ``Preempt``, ``Wait``, ``Finish``) live in
  :mod:`~elastrain.scheduler.decisions` and are re-exported by ``api``.
* Policies: :mod:`~elastrain.scheduler.static` (``static``, ``static-backfill``),
  :mod:`~elastrain.scheduler.tiresias` (the Pollux artifact's 2D-LAS),
  :mod:`~elastrain.scheduler.elastic` (+ ``elastic_plan``); shared least-attained-service ranking in
  :mod:`~elastrain.scheduler.ranking`; by name (:class:`~elastrain.scheduler.registry.PolicyName`)
  through :mod:`~elastrain.scheduler.registry`.
* :mod:`~elastrain.scheduler.throughput` — the fitted Pollux step-time model, placement-aware
  (speed by GPU count *and* node count); the same ``job_speed`` drives policies and simulator.
* :mod:`~elastrain.scheduler.simulator` (+ ``trace``, ``metrics``, ``plot``, ``cli``) —
  ``elastrain simulate``: the same policies on a virtual clock. See docs/scheduler.md.
* Benchmark mode (Pollux's own evaluation, ``elastrain simulate --benchmark``):
  :mod:`~elastrain.scheduler.goodput` (Pollux's goodput model, batch-size optimiser, profile fit),
  :mod:`~elastrain.scheduler.benchmark` (job lists and per-model measurements),
  :mod:`~elastrain.scheduler.benchsim` (the epoch-based loop on the artifact's 60 s grid),
  :mod:`~elastrain.scheduler.benchreport` and :mod:`~elastrain.scheduler.benchcli`.

Nothing here imports numpy, scipy or matplotlib at module import time, nor anything of the control
plane (``elastrain.server``, ``portal``, ``db``, ``backends``; an import-linter contract checks it).
"""
