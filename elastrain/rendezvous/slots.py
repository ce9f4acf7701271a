"""Slot bookkeeping: which worker slots of which hosts the coordinator may (re)fill.

A host's quota starts at its slot count. A slot whose worker asked to leave is not refilled (the
scheduler took it), unless the job falls below its minimum and restarts remain, or the host's line in
the host list changes. A slot whose worker was lost (killed, its process gone) on a host whose agent
is still there is refilled while the job is below ``--max-np`` and restarts remain: the job takes
the free slot back instead of training on fewer workers for the rest of its run. Worker ids are
``host#local_rank``, with ``.N`` for the N-th replacement in the same slot.
"""

from __future__ import annotations

from collections.abc import Iterable


class SlotBook:
    """Per-host quotas and per-slot incarnation counters."""

    def __init__(self, max_restarts: int) -> None:
        self.max_restarts = max_restarts
        self.restarts = 0
        self._quota: dict[str, int] = {}
        self._incarnations: dict[tuple[str, int], int] = {}
        self._lost: dict[str, int] = {}  # host -> slots lost to failures, not yet refilled

    def set_hosts(self, old: dict[str, int], new: dict[str, int]) -> None:
        """A host list change: hosts added or resized get their full quota back."""
        for host, slots in new.items():
            if old.get(host) != slots:
                self._quota[host] = slots
                self._lost.pop(host, None)
        for host in old:
            if host not in new:
                self._quota.pop(host, None)

    def release(self, host: str) -> None:
        """A slot of `host` was lost (failure, SIGTERM): do not refill it."""
        self._quota[host] = max(0, self._quota.get(host, 0) - 1)

    def lose(self, host: str) -> None:
        """A worker of `host` was lost (killed, its process gone): its slot may be taken back."""
        self.release(host)
        self._lost[host] = self._lost.get(host, 0) + 1

    def reclaim(self, host: str) -> None:
        """A worker declared lost is back and occupies its slot again."""
        self._quota[host] = self._quota.get(host, 0) + 1
        if self._lost.get(host):
            self._lost[host] -= 1

    def refill_lost(self, budget: int, hosts: Iterable[str]) -> None:
        """Allow up to `budget` respawns into slots lost on `hosts` (those with an agent), bounded by
        max_restarts."""
        for host in hosts:
            while budget > 0 and self._lost.get(host, 0) > 0 and self.restarts < self.max_restarts:
                self._quota[host] = self._quota.get(host, 0) + 1
                self._lost[host] -= 1
                self.restarts += 1
                budget -= 1

    def refill(self, missing: int, hosts: dict[str, int]) -> None:
        """Below the minimum: allow up to `missing` respawns into lost slots, bounded by max_restarts."""
        for host, slots in hosts.items():
            while missing > 0 and self._quota.get(host, 0) < slots and self.restarts < self.max_restarts:
                self._quota[host] = self._quota.get(host, 0) + 1
                self._lost[host] = max(0, self._lost.get(host, 0) - 1)
                self.restarts += 1
                missing -= 1

    def free_slots(self, host: str, slots: int, used: Iterable[int], budget: int) -> list[tuple[str, int]]:
        """Up to `budget` (worker id, local rank) pairs to spawn on `host` now."""
        used = set(used)
        allowed = self._quota.get(host, 0) - len(used)
        free = [i for i in range(slots) if i not in used][: max(0, min(allowed, budget))]
        out = []
        for local_rank in free:
            incarnation = self._incarnations.get((host, local_rank), 0)
            self._incarnations[(host, local_rank)] = incarnation + 1
            out.append((f"{host}#{local_rank}" + (f".{incarnation}" if incarnation else ""), local_rank))
        return out
