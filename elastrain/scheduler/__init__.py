"""Elastic GPU scheduler: policies as pure functions of the cluster state, and a trace simulator.

* :mod:`~elastrain.scheduler.api` — ``Node``, ``Job``, ``ClusterState``, the decisions (``Start``,
  ``Grow``, ``Shrink``, ``PreemptToMin``, ``Preempt``, ``Wait``, ``Finish``), the ``Policy`` ABC and
  ``apply`` (the one place the inventory changes; it validates every decision).
* Policies: :mod:`~elastrain.scheduler.static`, :mod:`~elastrain.scheduler.elastic`,
  :mod:`~elastrain.scheduler.tiresias`; by name through :mod:`~elastrain.scheduler.registry`.
* :mod:`~elastrain.scheduler.throughput` — the fitted Pollux step-time model (speed by GPU count).
* :mod:`~elastrain.scheduler.simulator` (+ ``trace``, ``metrics``, ``plot``, ``cli``) —
  ``elastrain simulate``: the same policies on a virtual clock.

Nothing here imports numpy, scipy or matplotlib at module import time.
"""
