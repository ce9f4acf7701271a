"""Typed contracts between elastrain's processes, each defined once and versioned.

- `env`: the ``ELASTRAIN_*`` environment variables the launcher and the agent set for a worker.
- `report`: the progress and checkpoint reports a job's rank 0 posts to the control plane.
- `ledger`: the exactly-once ledger records each worker appends.
"""
