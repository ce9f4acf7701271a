"""The generation cycle: join -> build the group -> sync the state -> train -> commit/interrupt -> next.

`GenerationCycle` is the one owner of that cycle for a `State` on this process's `Runtime`.
`run` calls the user's function inside it; the function's `state.commit()` lands in `commit`, whose
jobs are the named steps below (in order): count the sampler step, write the ledger record, report
the generation's first step, advance the counters, send a progress report, save a checkpoint, and
agree with every rank whether a new generation is pending. A pending generation, or a collective
elastrain issued that failed (`PeerFailure`), unwinds to `run`, which rolls the state back to its
last commit and starts the next generation; any other exception fails the job (`JobFailed`).
"""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from elastrain.errors import ConfigError, CoordinatorGone, HostsUpdatedInterrupt, MembershipChange
from elastrain.rendezvous.api import Generation
from elastrain.runtime.checkpoint import (
    Checkpointer,
    CheckpointPolicy,
    CheckpointStats,
    check_model_matches,
    load_checkpoint,
)
from elastrain.runtime.collective import describe, peer_failures
from elastrain.runtime.connection import Runtime, get_runtime
from elastrain.runtime.data import StepSlice
from elastrain.runtime.gradsync import GradientSync, StepShape
from elastrain.runtime.progress import ProgressReporter

if TYPE_CHECKING:
    from elastrain.runtime.state import State

log = logging.getLogger("elastrain")
T = TypeVar("T")


class GenerationCycle:
    """Drives one `State` through the generations of `rt`'s job (the `StepDriver` of the state)."""

    def __init__(self, state: State, rt: Runtime) -> None:
        self.state = state
        self.rt = rt
        self.synced_generation: int | None = None  # the generation whose state this rank holds
        self.reported_generation: int | None = None  # the generation whose first step was reported
        self.last_world = 0
        self.resumed = False
        self.agreed_pending: bool | None = None  # rode along the gradient all-reduce of this step
        self.processed_step: int | None = None  # the step whose samples the ledger has (its all-reduce)
        self.samples_total = 0
        self.progress = ProgressReporter()
        self.grads = GradientSync(self._overlap_shape)
        self.checkpointer: Checkpointer | None = None
        state.attach(self)

    @classmethod
    def of(cls, state: State, rt: Runtime) -> GenerationCycle:
        """The cycle driving `state` on `rt` (created on first use)."""
        driver = state._driver
        if isinstance(driver, cls) and driver.rt is rt:
            return driver
        return cls(state, rt)

    @classmethod
    def standalone(cls, state: State) -> GenerationCycle:
        """`state` used without `@elastrain.run`: allowed in a plain script (a world of one) only."""
        rt = get_runtime()
        if rt.rendezvous is not None:
            raise ConfigError("call state.commit() inside a function wrapped with @elastrain.run")
        return cls.of(state, rt)

    # ----- the cycle ---------------------------------------------------------------------------
    def run(self, func: Callable[..., T], args: tuple[Any, ...], kwargs: dict[str, Any]) -> T:
        """Call ``func(state, ...)`` once per generation until it returns on this rank."""
        rt, state = self.rt, self.state
        while True:
            try:
                rt.ensure_group(state.step)
                self.sync_state()
                result = func(state, *args, **kwargs)
            except HostsUpdatedInterrupt:
                self._stop_if_coordinator_gone()
                self._hand_over_parts()
                rt.invalidate()
                self.rollback()
                continue
            except (SystemExit, KeyboardInterrupt):
                raise
            except MembershipChange as exc:  # PeerFailure: a collective elastrain issued failed
                log.warning("%s: collective failed (%s); rejoining", rt.context.worker_id, describe(exc))
                self.rollback()
                self._stop_if_coordinator_gone()
                rt.invalidate()
                continue
            except BaseException as exc:  # the user's error: it fails the job
                if rt.rendezvous is None:
                    raise
                raise rt.report_failure(exc) from exc
            self.finish_checkpoints()
            rt.finish()
            return result

    def rollback(self) -> None:
        """After an interrupted step: back to the last commit; the step in flight is dropped."""
        self.state.rollback()
        self.grads.abandon()
        self.agreed_pending = None

    def sync_state(self) -> None:
        """Bring this rank to the state of the generation's most advanced member (once per generation)."""
        rt, state = self.rt, self.state
        self._setup_checkpoints()
        generation = rt.generation
        if generation is None:  # a plain script: a world of one
            if not self.resumed:
                self._resume()
                self._regroup_parts(0)
            return
        if self.synced_generation == generation.number:
            return
        if rt.rank == generation.src_rank and generation.members[generation.src_rank].committed_step <= 0:
            self._resume()  # a fresh job: the source loads the checkpoint, the broadcast spreads it
        if generation.sync_state and generation.world_size > 1:
            state.broadcast(generation.src_rank, rt.rank, rt.groups.device)
        self._regroup_parts(generation.number)
        self.synced_generation = generation.number
        rt.ledger.generation(generation.number, rt.rank, rt.world_size, state.step, generation.cause.value)
        if state.sampler is not None:
            state.sampler.reset()
        old, new = self.last_world, rt.world_size
        self.last_world = new
        if old and old != new:
            state.resized(old, new)

    def _regroup_parts(self, generation: int) -> None:
        """The state's parts rebuild for this generation (collectives: a failure is a peer failure)."""
        for part in self.state.parts:
            with peer_failures(f"{type(part).__name__} rebuilding for generation {generation}"):
                part.regrouped(self.rt.rank, self.rt.world_size, self.state.step, generation)

    def _hand_over_parts(self) -> None:
        """All ranks stopped together for a new generation: the state's parts hand over what may leave
        (over the old group, which still works; if it fails, the next generation makes do without)."""
        number = self.rt.generation.number if self.rt.generation is not None else 0
        for part in self.state.parts:
            try:
                with peer_failures(f"{type(part).__name__} handing over before generation {number + 1}"):
                    part.interrupted(self.rt.rank, self.rt.world_size, self.state.step, number)
            except MembershipChange as exc:
                log.warning("%s: %s", self.rt.context.worker_id, describe(exc))

    def _commit_parts(self, step: int) -> None:
        """The state's parts keep what a new generation needs of `step`, before it is committed (a
        failure here leaves it uncommitted: the step is done again)."""
        number = self.rt.generation.number if self.rt.generation is not None else 0
        for part in self.state.parts:
            with peer_failures(f"{type(part).__name__} at the commit of step {step}"):
                part.committed(self.rt.rank, self.rt.world_size, step, number)

    def _stop_if_coordinator_gone(self) -> None:
        """The coordinator never came back: rank 0 writes a durable checkpoint; `CoordinatorGone` (exit 3)."""
        rt = self.rt
        if not rt.coordinator_gone:
            return
        self.finish_checkpoints()
        where = (
            f"; checkpoint at step {self.state.step}" if rt.context.checkpoint_dir and rt.rank == 0 else ""
        )
        message = (
            f"elastrain: the coordinator did not come back within {rt.context.coordinator_timeout_s:.0f}s"
            f"{where}; start `elastrain run ... --resume auto` again"
        )
        print(message, file=sys.stderr, flush=True)
        rt.groups.destroy()
        rt.ledger.close()
        raise CoordinatorGone(message)

    # ----- the step ----------------------------------------------------------------------------
    def rank_and_world(self) -> tuple[int, int]:
        """This worker's rank and the world size of the current generation."""
        return self.rt.rank, self.rt.world_size

    def _collective(self) -> bool:
        return self.rt.world_size > 1 or self.rt.rendezvous is not None

    def _overlap_shape(self) -> StepShape | None:
        """The sampler step in flight, for the gradient hooks (None: no overlap possible)."""
        sampler = self.state.sampler
        current = sampler.current() if sampler is not None else None
        if current is None or not self._collective():
            return None
        return StepShape(len(current.indices), current.size, current.size % self.rt.world_size == 0)

    def allreduce_gradients(self, loss_reduction: str) -> int:
        """The sample-weighted gradient all-reduce; the pending flag rides along (see `State`)."""
        rt, state = self.rt, self.state
        assert state.model is not None
        current = state.sampler.current() if state.sampler is not None else None
        collective = self._collective()
        if current is not None:
            shape = StepShape(len(current.indices), current.size, current.size % rt.world_size == 0)
        else:  # one sample per rank: the plain average over ranks
            world = rt.world_size if collective else 1
            shape = StepShape(1, world, True)
        if current is not None and rt.generation is not None:
            rt.ledger.processed(rt.generation.number, current.epoch, state.step, current.indices)
            self.processed_step = state.step
        params = [p for p in state.model.parameters() if p.requires_grad]
        total, self.agreed_pending = self.grads.allreduce(
            params, shape, loss_reduction, rt.pending(), collective, rt.context.bucket_bytes
        )
        return total

    def commit(self, loss: float | torch.Tensor | None) -> None:
        """Commit the step in flight; raises `HostsUpdatedInterrupt` on every rank when a resize is due."""
        self._commit_parts(self.state.step + 1)
        batch = self._count_samples()
        generation = self.rt.generation
        first_of_generation = False
        if generation is not None:
            self._record_commit(generation, batch)
            first_of_generation = self._report_first_step(generation)
        self.state.advance()
        if self.rt.rendezvous is not None:
            self.rt.rendezvous.committed_step = self.state.step
        self._report_progress(loss, first_of_generation)
        self._save_checkpoint()
        if self._generation_pending():
            raise HostsUpdatedInterrupt(f"generation change at step {self.state.step}")

    def _count_samples(self) -> StepSlice | None:
        """The sampler's step is done: add its samples to the running total."""
        sampler = self.state.sampler
        batch = sampler.commit_step() if sampler is not None else None
        if batch is not None:
            self.samples_total += batch.size
        return batch

    def _record_commit(self, generation: Generation, batch: StepSlice | None) -> None:
        """The ledger's committed record of this step."""
        epoch = batch.epoch if batch is not None else getattr(self.state, "epoch", 0)
        if batch is not None and self.processed_step != self.state.step:  # no elastrain all-reduce (ZeRO)
            self.rt.ledger.processed(generation.number, batch.epoch, self.state.step, batch.indices)
        self.rt.ledger.committed(generation.number, epoch, self.state.step, self.rt.world_size)

    def _report_first_step(self, generation: Generation) -> bool:
        """Rank 0 tells the coordinator when a generation's first step is done; True on that step."""
        if self.reported_generation == generation.number:
            return False
        self.reported_generation = generation.number
        if self.rt.rank == 0 and self.rt.rendezvous is not None:
            self.rt.rendezvous.report_first_step(generation.number, time.time())
        return True

    def _report_progress(self, loss: float | torch.Tensor | None, first_of_generation: bool) -> None:
        """Rank 0's rate-limited report to the control plane; a generation's first step at once
        (a draining container waits for it)."""
        rt, state = self.rt, self.state
        if rt.rank != 0 or not (self.progress.due() or (first_of_generation and self.progress.enabled)):
            return
        epoch = state.sampler.epoch if state.sampler is not None else int(getattr(state, "epoch", 0))
        value = float(loss.detach()) if isinstance(loss, torch.Tensor) else loss
        hosts = sorted({m.host for m in rt.generation.members}) if rt.generation is not None else []
        self.progress.report(state.step, epoch, rt.world_size, self.samples_total, value, hosts)

    def _save_checkpoint(self) -> None:
        """Rank 0 saves a durable checkpoint when one is due (in the background)."""
        if self.checkpointer is not None and self.rt.rank == 0 and self.checkpointer.due(self.state.step):
            self.checkpointer.save(self.state.state_dict(), self.rt.world_size)

    def _generation_pending(self) -> bool:
        """Do all ranks agree a new generation is pending? (free when it rode the gradient all-reduce)"""
        pending = self.agreed_pending
        self.agreed_pending = None
        if pending is None:
            pending = self.rt.agree_pending(self.rt.pending()) if self.rt.rendezvous is not None else False
        return pending

    # ----- durable checkpoints -------------------------------------------------------------------
    @property
    def checkpoint_stats(self) -> CheckpointStats | None:
        """Stall and write times of the saves so far (None without checkpointing)."""
        return self.checkpointer.stats if self.checkpointer is not None else None

    def _setup_checkpoints(self) -> None:
        ctx = self.rt.context
        if self.checkpointer is None and ctx.checkpoint_dir is not None:
            self.checkpointer = Checkpointer(
                CheckpointPolicy(
                    ctx.checkpoint_dir,
                    ctx.checkpoint_every_steps,
                    ctx.checkpoint_every_seconds,
                    ctx.checkpoint_keep,
                )
            )
            if self.rt.rank == 0 and self.progress.enabled:  # the job page lists the checkpoints
                self.checkpointer.on_published = self.progress.checkpoint

    def _resume(self) -> None:
        self.resumed = True
        path = self.rt.context.resume_from
        if path is None:
            return
        saved = load_checkpoint(path)
        if self.state.model is not None:
            check_model_matches(self.state.model.state_dict(), saved, path)
        self.state.load_state_dict(saved)
        if self.checkpointer is not None:
            self.checkpointer._last_step = self.state.step
        print(f"elastrain: resumed from {path} at step {self.state.step}", flush=True)

    def finish_checkpoints(self) -> None:
        """Training ended on this rank: rank 0 writes a final checkpoint and waits for it."""
        if self.checkpointer is None:
            return
        if self.rt.rank == 0:
            self.checkpointer.save(self.state.state_dict(), self.rt.world_size, background=False)
        self.checkpointer.wait()
