"""ElasticSampler: every sample of an epoch exactly once, across any sequence of resizes and failures.

Each epoch is a seeded permutation of the dataset and a cursor: how many samples of it are committed.
A step takes the next global batch ``permutation[cursor : cursor + B]`` and splits it into
contiguous, near-equal shares, one per rank. The cursor moves only when the step commits, so after a
resize or a failure the rest of the permutation is split over the new world: nothing is skipped or
repeated, and the last uneven step is not padded.
"""

from __future__ import annotations

import enum
import logging
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from elastrain.errors import ConfigError

log = logging.getLogger("elastrain.sampler")


class BatchPolicy(str, enum.Enum):
    """How the batch behaves when the world size changes."""

    FIXED = "fixed"  # the global batch stays B; each rank takes its share
    LINEAR = "linear"  # each rank keeps its batch b; the global batch is b * world (scale the LR)


@dataclass(frozen=True)
class StepSlice:
    """One step's global batch (`start`, `size` within the epoch) and this rank's indices."""

    epoch: int
    start: int
    size: int
    indices: list[int]


def split_evenly(total: int, parts: int, part: int) -> tuple[int, int]:
    """The [lo, hi) range of `part` when `total` items are cut into `parts` near-equal pieces."""
    base, extra = divmod(total, parts)
    lo = part * base + min(part, extra)
    return lo, lo + base + (1 if part < extra else 0)


class ElasticSampler:
    """Yields this rank's indices for each step; use as ``for indices in sampler`` or a batch_sampler.

    `batch_size` is the global batch under the ``fixed`` policy and the per-rank batch under
    ``linear``. Call ``state.commit()`` once per step; it advances the cursor.
    """

    def __init__(
        self,
        num_samples: int,
        batch_size: int,
        *,
        policy: BatchPolicy | str = BatchPolicy.FIXED,
        seed: int = 0,
        shuffle: bool = True,
    ) -> None:
        if num_samples < 1:
            raise ConfigError(f"ElasticSampler needs at least one sample, got num_samples={num_samples}")
        if batch_size < 1:
            raise ConfigError(f"ElasticSampler batch_size must be >= 1, got {batch_size}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.policy = BatchPolicy(policy)
        self.seed = seed
        self.shuffle = shuffle
        self.epoch = 0
        self.cursor = 0
        self._committed = (0, 0)  # (epoch, cursor) as of the last commit: what a rollback returns to
        self._perm: list[int] | None = None
        self._perm_epoch = -1
        self._in_flight: deque[StepSlice] = deque()
        self._world: Callable[[], tuple[int, int]] = lambda: (0, 1)

    def bind(self, world: Callable[[], tuple[int, int]]) -> None:
        """Give the sampler a source of (rank, world_size); `State` does this."""
        self._world = world

    def set_epoch(self, epoch: int) -> None:
        """Move to `epoch`; the cursor restarts only when the epoch actually changes."""
        if epoch != self.epoch:
            self.epoch = epoch
            self.cursor = 0
            self._in_flight.clear()

    def global_batch(self, world_size: int) -> int:
        """Samples per step at `world_size`."""
        return self.batch_size if self.policy == BatchPolicy.FIXED else self.batch_size * world_size

    def permutation(self) -> list[int]:
        """This epoch's order of sample indices."""
        if self._perm is None or self._perm_epoch != self.epoch:
            if self.shuffle:
                import torch

                gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
                self._perm = torch.randperm(self.num_samples, generator=gen).tolist()
            else:
                self._perm = list(range(self.num_samples))
            self._perm_epoch = self.epoch
        return self._perm

    def remaining(self) -> int:
        """Samples of this epoch not yet committed."""
        return self.num_samples - self.cursor

    def __iter__(self) -> Iterator[list[int]]:
        self._in_flight.clear()
        rank, world = self._world()
        perm = self.permutation()
        position = self.cursor
        step_size = self.global_batch(world)
        while position < self.num_samples:
            size = min(step_size, self.num_samples - position)
            lo, hi = split_evenly(size, world, rank)
            indices = perm[position + lo : position + hi]
            self._in_flight.append(StepSlice(self.epoch, position, size, indices))
            position += size
            yield indices

    def __len__(self) -> int:
        _, world = self._world()
        step = self.global_batch(world)
        return -(-self.remaining() // step)

    def current(self) -> StepSlice | None:
        """The oldest step handed out and not yet committed."""
        return self._in_flight[0] if self._in_flight else None

    def commit_step(self) -> StepSlice | None:
        """Mark the oldest in-flight step committed; returns it (None if nothing was in flight)."""
        if not self._in_flight:
            return None
        step = self._in_flight.popleft()
        if step.epoch == self.epoch and step.start == self.cursor:
            self.cursor += step.size
        self._committed = (self.epoch, self.cursor)
        return step

    def reset(self) -> None:
        """Return to the last commit: forget steps handed out since and an uncommitted epoch change."""
        self._in_flight.clear()
        self.epoch, self.cursor = self._committed

    def state_dict(self) -> dict[str, Any]:
        """The committed position (what a resize or a checkpoint must carry)."""
        epoch, cursor = self._committed
        return {
            "epoch": epoch,
            "cursor": cursor,
            "num_samples": self.num_samples,
            "batch_size": self.batch_size,
            "seed": self.seed,
            "policy": self.policy.value,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore from `state_dict` (refuses a sampler of another dataset size)."""
        if int(state["num_samples"]) != self.num_samples:
            raise ConfigError(
                f"sampler state is for {state['num_samples']} samples, this dataset has {self.num_samples}"
            )
        saved_seed = int(state.get("seed", self.seed))
        if saved_seed != self.seed:
            # the cursor only means something in the saved order: keep it, or samples would repeat or vanish
            log.warning(
                "sampler seed %d differs from the saved %d; using the saved one", self.seed, saved_seed
            )
            self.seed = saved_seed
            self._perm = None
        self.epoch = int(state["epoch"])
        self.cursor = int(state["cursor"])
        self._committed = (self.epoch, self.cursor)
        self._in_flight.clear()


def micro_batches(indices: list[int], limit: int | None) -> list[list[int]]:
    """Cut a rank's share into chunks of at most `limit` (gradient accumulation); one chunk if None."""
    if not limit or len(indices) <= limit:
        return [indices]
    return [indices[i : i + limit] for i in range(0, len(indices), limit)]
