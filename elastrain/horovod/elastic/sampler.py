"""``hvd.elastic.ElasticSampler``: the epoch's samples not yet processed, re-split after every reset.

Horovod's semantics: each epoch is one order of the dataset (shuffled with ``random.Random(seed +
epoch)``, as Horovod does); ``record_batch`` counts the samples the whole job has processed
(``processed_num``, a prefix of that order); after a reset the rest of the order is split again over
the new world: rank ``r`` of ``R`` takes ``remaining[r::R]``. So a sample is processed exactly once
per epoch across any number of resizes, provided ``record_batch`` is called for every batch before
``state.commit()`` (or before the next ``check_host_updates()``).

Differences from Horovod, all at an epoch's last step or in ``set_epoch``:

* once ``record_batch`` has told the sampler the batch size, the last step is not padded with
  repeated samples: each rank takes its share of what is left, so every rank still runs the same
  number of steps. Only when fewer samples than ranks are left does a rank repeat one of them.
  Before the batch size is known (no ``record_batch`` yet), the rest is padded as in Horovod.
* ``set_epoch(e)`` for the epoch the sampler is already in keeps its progress (Horovod restarts the
  epoch), so ``sampler.set_epoch(epoch)`` at the top of the epoch loop is safe across resets.
* ``record_indices(indices)`` (Horovod 0.21's API) marks samples processed anywhere in the order;
  it must be given the same indices on every rank.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sized
from typing import Any

import torch.utils.data

from elastrain.horovod import basics


def _world() -> tuple[int, int]:
    """(rank, size) of the current generation; tests replace it."""
    return basics.rank(), basics.size()


def padding(n: int, replicas: int, rank: int, batch_size: int | None) -> list[int]:
    """Positions in the remaining list that rank `rank` takes after its ``remaining[rank::replicas]``.

    Without a batch size: Horovod's padding to ``ceil(n / replicas)`` samples per rank. With one: a
    repeat only for a rank that has no sample in the epoch's last (partial) step.
    """
    if n == 0:
        return []
    own = len(range(rank, n, replicas))
    if batch_size is None:
        per_rank = math.ceil(n / replicas)
        if own >= per_rank:
            return []
        return [(rank + replicas * (per_rank - 1) - n) % n]
    step = batch_size * replicas
    full = (n // step) * step
    tail = n - full
    if tail == 0 or rank < tail:
        return []
    return [full + rank % tail]


class ElasticSampler(torch.utils.data.Sampler[int]):
    """Partitions the dataset across ranks and repartitions what is left after every reset.

    Put it in the ``TorchState`` (e.g. ``TorchState(model, optimizer, train_sampler=sampler)``), call
    ``record_batch(batch_idx, batch_size)`` after each batch, and ``set_epoch(epoch)`` for each epoch.
    """

    def __init__(self, dataset: Sized, shuffle: bool = True, seed: int = 0) -> None:
        self.dataset = dataset
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0
        self.processed_num = 0  # samples of this epoch's order processed by the job (a prefix)
        self.processed_indices: set[int] = set()  # processed beyond the prefix (record_indices)
        self.batch_size: int | None = None  # per rank; learnt from record_batch
        self.num_replicas = 0
        self.rank = 0
        self.remaining_indices: list[int] = []
        self.num_samples = 0
        self.total_size = 0
        self.indices: list[int] = []
        self._positions: list[int] = []  # where each remaining index sits in the epoch's order
        self._consumed = 0  # remaining samples recorded since the last reset
        self._yielded: deque[int] = deque()  # this rank's samples handed out, not yet recorded
        self._on_processed: Callable[[int, list[int]], None] | None = None
        self.reset()

    # ----- the epoch's order and what is left of it ------------------------------------------------
    def _order(self) -> list[int]:
        order = list(range(len(self.dataset)))
        if self.shuffle:
            random.Random(self.seed + self.epoch).shuffle(order)  # Horovod's order
        return order

    def reset(self) -> None:
        """Recompute what is left of the epoch and this rank's share of it, for the current world."""
        self.rank, self.num_replicas = _world()
        order = self._order()
        extra = self.processed_indices
        self._positions = [j for j in range(self.processed_num, len(order)) if order[j] not in extra]
        self.remaining_indices = [order[j] for j in self._positions]
        self._consumed = 0
        self._yielded.clear()
        n = len(self.remaining_indices)
        self.num_samples = len(range(self.rank, n, self.num_replicas)) + len(
            padding(n, self.num_replicas, self.rank, self.batch_size)
        )
        self.total_size = (
            n if self.batch_size is not None else math.ceil(n / self.num_replicas) * self.num_replicas
        )

    def set_epoch(self, epoch: int) -> None:
        """Start `epoch` (no-op when the sampler is already in it: its progress is kept)."""
        if epoch == self.epoch:
            return
        self.epoch = epoch
        self.processed_num = 0
        self.processed_indices = set()
        self.reset()

    # ----- recording progress --------------------------------------------------------------------
    def record_batch(self, batch_idx: int, batch_size: int) -> None:
        """One more batch of `batch_size` samples per rank is processed (every rank calls it)."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        take = min(batch_size * self.num_replicas, len(self.remaining_indices) - self._consumed)
        self._consumed += take
        if self._consumed >= len(self.remaining_indices):
            self.processed_num = len(self.dataset)
            self.processed_indices = set()
        elif self._consumed > 0:
            self.processed_num = self._positions[self._consumed - 1] + 1
        mine = [self._yielded.popleft() for _ in range(min(batch_size, len(self._yielded)))]
        self._log(mine)

    def record_indices(self, indices: Iterable[int]) -> None:
        """Mark these dataset indices processed this epoch (give the same indices on every rank)."""
        done = {int(i) for i in indices}
        self.processed_indices |= done
        mine = [i for i in self._yielded if i in done]
        if mine:
            self._yielded = deque(i for i in self._yielded if i not in done)
        self._log(mine)

    def _log(self, indices: list[int]) -> None:
        if indices and self._on_processed is not None:
            self._on_processed(self.epoch, indices)

    # ----- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Horovod's ``{epoch, processed_num}`` plus the learnt batch size and any recorded extras."""
        return {
            "epoch": self.epoch,
            "processed_num": self.processed_num,
            "processed_indices": sorted(self.processed_indices),
            "batch_size": self.batch_size,
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore from ``state_dict`` (also Horovod's own, without the extra keys) and re-split."""
        self.epoch = int(state_dict["epoch"])
        self.processed_num = int(state_dict.get("processed_num", 0))
        self.processed_indices = {int(i) for i in state_dict.get("processed_indices", ())}
        batch_size = state_dict.get("batch_size")
        self.batch_size = int(batch_size) if batch_size else self.batch_size
        self.reset()

    # ----- iteration -------------------------------------------------------------------------------
    def __iter__(self) -> Iterator[int]:
        remaining, rank, replicas = self.remaining_indices, self.rank, self.num_replicas
        self._yielded.clear()
        self.indices = remaining[rank::replicas]
        for index in self.indices:
            self._yielded.append(index)
            yield index
        # decided at the end: by now record_batch has told every rank the batch size
        for position in padding(len(remaining), replicas, rank, self.batch_size):
            self._yielded.append(remaining[position])
            yield remaining[position]

    def __len__(self) -> int:
        """This rank's samples for the rest of the epoch (changes after a resize)."""
        return self.num_samples


__all__ = ["ElasticSampler", "padding"]
