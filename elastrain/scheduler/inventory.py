"""GPU bookkeeping shared by :func:`elastrain.scheduler.api.apply` and by policies that plan.

A placement is a tuple of ``(node_id, workers)`` pairs sorted by node id; a worker (container) needs
``gpus_per_worker`` GPUs on one node. :class:`Inventory` is a mutable scratch copy of the free GPUs
per node and every running job's placement. ``apply`` replays decisions on one; a policy plans on
another with the same methods, so a plan that fits in the policy also fits in ``apply``.
"""

from __future__ import annotations

from collections.abc import Iterable

from elastrain.errors import ElastrainError

Placement = tuple[tuple[str, int], ...]


class InvalidDecision(ElastrainError):
    """A decision that would break the inventory: double-booked GPUs, a gang below its minimum, ..."""


def placement_workers(placement: Placement) -> int:
    """Workers in a placement."""
    return sum(n for _, n in placement)


class Inventory:
    """Free GPUs per node plus each running job's placement; every change keeps them consistent."""

    __slots__ = ("free", "placements")

    def __init__(self, free: dict[str, int], placements: dict[str, Placement]) -> None:
        self.free = free
        self.placements = placements

    def copy(self) -> Inventory:
        """An independent copy (for a policy's what-if planning)."""
        return Inventory(dict(self.free), dict(self.placements))

    def capacity(self, gpus_per_worker: int, extra: Iterable[tuple[str, int]] = ()) -> int:
        """How many more workers of ``gpus_per_worker`` GPUs fit in the free GPUs (plus ``extra``)."""
        if gpus_per_worker == 1 and not extra:
            return sum(self.free.values())
        free = dict(self.free)
        for node, gpus in extra:
            free[node] += gpus
        return sum(f // gpus_per_worker for f in free.values())

    def workers(self, job_id: str) -> int:
        """Workers the job holds now (0 if not running)."""
        return placement_workers(self.placements.get(job_id, ()))

    def add(self, job_id: str, gpus_per_worker: int, count: int) -> Placement:
        """Place ``count`` more workers of ``job_id``: nodes it already uses first, then the nodes with
        the most free GPUs (ties by node id). All or nothing: raises :class:`InvalidDecision`."""
        if count <= 0:
            raise InvalidDecision(f"job {job_id}: cannot add {count} workers")
        if self.capacity(gpus_per_worker) < count:
            raise InvalidDecision(
                f"job {job_id}: {count} worker(s) of {gpus_per_worker} GPU(s) do not fit in the free GPUs"
            )
        current = dict(self.placements.get(job_id, ()))
        order = sorted(self.free, key=lambda node: (node not in current, -self.free[node], node))
        left = count
        for node in order:
            fit = min(self.free[node] // gpus_per_worker, left)
            if fit > 0:
                self.free[node] -= fit * gpus_per_worker
                current[node] = current.get(node, 0) + fit
                left -= fit
                if left == 0:
                    break
        placement = tuple(sorted(current.items()))
        self.placements[job_id] = placement
        return placement

    def nodes_after_add(self, job_id: str, gpus_per_worker: int, count: int) -> int:
        """Nodes ``job_id`` would span after :meth:`add` of ``count`` workers (same placement rule,
        nothing changes); 0 if they do not fit. What a policy feeds the throughput model."""
        current = self.placements.get(job_id, ())
        used = {node for node, _ in current}
        if count <= 0:
            return len(used)
        if self.capacity(gpus_per_worker) < count:
            return 0
        left = count
        for node in sorted(self.free, key=lambda nd: (nd not in used, -self.free[nd], nd)):
            fit = min(self.free[node] // gpus_per_worker, left)
            if fit > 0:
                used.add(node)
                left -= fit
                if left == 0:
                    break
        return len(used)

    def nodes_after_remove(self, job_id: str, count: int) -> int:
        """Nodes ``job_id`` would span after :meth:`remove` of ``count`` workers (nothing changes)."""
        current = dict(self.placements.get(job_id, ()))
        left = count
        for node in sorted(current, key=lambda nd: (current[nd], _neg_key(nd))):
            if left <= 0:
                break
            take = min(current[node], left)
            current[node] -= take
            left -= take
        return sum(1 for v in current.values() if v > 0)

    def remove(self, job_id: str, gpus_per_worker: int, count: int) -> Placement:
        """Release ``count`` workers of ``job_id`` from the nodes where it has the fewest (ties: the
        last node id), keeping the rest together. Raises :class:`InvalidDecision` if it has fewer."""
        current = dict(self.placements.get(job_id, ()))
        if count <= 0 or count > sum(current.values()):
            raise InvalidDecision(f"job {job_id}: cannot release {count} of its {sum(current.values())}")
        left = count
        for node in sorted(current, key=lambda nd: (current[nd], _neg_key(nd))):
            take = min(current[node], left)
            current[node] -= take
            self.free[node] += take * gpus_per_worker
            left -= take
            if current[node] == 0:
                del current[node]
            if left == 0:
                break
        placement = tuple(sorted(current.items()))
        if placement:
            self.placements[job_id] = placement
        else:
            self.placements.pop(job_id, None)
        return placement

    def remove_all(self, job_id: str, gpus_per_worker: int) -> None:
        """Release every worker of ``job_id`` (no-op if it holds none)."""
        held = self.workers(job_id)
        if held:
            self.remove(job_id, gpus_per_worker, held)


def _neg_key(node: str) -> tuple[int, ...]:
    """Sort key that orders node ids descending (so the last node is released first)."""
    return (*(-ord(c) for c in node), 1)
