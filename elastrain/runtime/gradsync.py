"""Sample-weighted gradient all-reduce: persistent bucket buffers, overlap with backward, flags riding along.

Parameters are cut into buckets (in reverse order, the order backward produces their gradients) with
one persistent flat buffer each: a fresh multi-MB buffer per step costs thousands of page faults on
the CPU. After the reduction each ``p.grad`` *is* its slice of a bucket, so nothing is copied back.

Overlap: a post-accumulate-grad hook moves each gradient into its bucket, already scaled by this
rank's share of the step's samples, and sets ``p.grad`` to None; a full bucket's async all-reduce
starts while backward is still running (buckets always start in index order, so every rank issues
the same collectives in the same order). The last (tail) bucket starts from `allreduce` with four
extra slots: sample count, pending-generation flag, "a gradient arrived twice" and "arrived after its
bucket had left". Overlap is armed for a step only when the previous step's slots say no rank saw
a gradient twice (no gradient accumulation), every rank has the same number of samples (so a wrong
guess of the loss reduction is one exact rescale) and a sampler step is in flight. A late gradient
(accumulation that started in an armed step) is not lost: it stays in ``p.grad`` and, since the
slots tell every rank, all ranks run one more reduction of the deltas. Early buckets leave before
the ledger's "processed" record is written; no rank can finish the step before the tail bucket, which
leaves after it, so the exactly-once accounting is unchanged. A failed all-reduce raises `PeerFailure`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from elastrain.runtime.collective import peer_failures

BUCKET_BYTES = 2 * 1024 * 1024  # the default; small enough that the first buckets leave early in backward
_SLOTS = 4  # count, pending flag, "a gradient arrived twice", "a gradient arrived after its bucket left"


@dataclass(frozen=True)
class StepShape:
    """A step as known before backward: this rank's samples, the step's, and are all shares equal."""

    local_n: int
    total: int
    equal: bool


@dataclass
class _Bucket:
    params: list[torch.nn.Parameter]
    positions: list[int]  # each parameter's position in the parameter list
    buffer: torch.Tensor  # numel (+ _SLOTS on the tail bucket)
    shaped: list[torch.Tensor]  # each parameter's slice, shaped like it
    numel: int
    ready: int = 0  # parameters moved in this step
    work: dist.Work | None = None
    launched: bool = False


@dataclass
class _Step:
    """Per-step bookkeeping, reset after every reduction."""

    armed: bool = False
    scale: float = 1.0  # the scale the hooks used (the guessed reduction)
    fired: set[int] = field(default_factory=set)  # parameter positions whose hook ran
    moved: set[int] = field(default_factory=set)  # ... whose gradient is in its bucket
    twice: bool = False
    late: bool = False
    next_launch: int = 0


def _scale(reduction: str, local_n: int, total: int) -> float:
    """Factor on this rank's gradient so that the sum over ranks is the mean over the step's samples."""
    total = max(total, 1)
    return local_n / total if reduction == "mean" else 1.0 / total


def _aliases(grad: torch.Tensor, view: torch.Tensor) -> bool:
    return grad.data_ptr() == view.data_ptr() and grad.shape == view.shape


class GradientSync:
    """Averages gradients over every sample of a step, across the world.

    `shape` tells the hooks about the step in flight (None when overlap is impossible: no sampler
    step, or a world of one without collectives).
    """

    def __init__(self, shape: Callable[[], StepShape | None]) -> None:
        self._shape = shape
        self._buckets: list[_Bucket] = []
        self._where: list[tuple[int, int]] = []  # parameter position -> (bucket, index in bucket)
        self._key: tuple[object, ...] = ()
        self._hooks: list[torch.utils.hooks.RemovableHandle] = []
        self._step: _Step | None = None
        self._overlap_ok = False  # the previous step's slots: no rank saw a gradient twice
        self._guess = "mean"  # the loss reduction of the previous call
        self._fresh = True  # no hooks were installed during this step's backward: nothing is known

    # ----- layout and hooks ----------------------------------------------------------------------
    def _layout(self, params: list[torch.nn.Parameter], bucket_bytes: int) -> list[_Bucket]:
        key = (bucket_bytes, *((id(p), p.dtype, p.device) for p in params))
        if key == self._key:
            return self._buckets
        self.abandon(keep_layout=False)
        groups: list[list[int]] = []
        size, kind = 0, None
        for pos in reversed(range(len(params))):
            p = params[pos]
            if not groups or size >= bucket_bytes or (p.dtype, p.device) != kind:
                groups.append([])
                size, kind = 0, (p.dtype, p.device)
            groups[-1].append(pos)
            size += p.numel() * p.element_size()
        self._where = [(0, 0)] * len(params)
        for b, positions in enumerate(groups):
            members = [params[pos] for pos in positions]
            numel = sum(p.numel() for p in members)
            extra = _SLOTS if b == len(groups) - 1 else 0
            buffer = torch.zeros(numel + extra, dtype=members[0].dtype, device=members[0].device)
            shaped, offset = [], 0
            for i, (pos, p) in enumerate(zip(positions, members)):
                shaped.append(buffer[offset : offset + p.numel()].view_as(p))
                offset += p.numel()
                self._where[pos] = (b, i)
            self._buckets.append(_Bucket(members, positions, buffer, shaped, numel))
        for pos, p in enumerate(params):
            self._hooks.append(p.register_post_accumulate_grad_hook(self._make_hook(pos)))
        self._key = key
        self._fresh = True
        return self._buckets

    def _make_hook(self, pos: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            self._on_grad(pos, param)

        return hook

    def _begin_step(self) -> _Step:
        step = _Step()
        shape = self._shape() if self._overlap_ok and len(self._buckets) > 1 else None
        if shape is not None and shape.equal and shape.local_n > 0:
            step.armed = True
            step.scale = _scale(self._guess, shape.local_n, shape.total)
        self._step = step
        return step

    def _on_grad(self, pos: int, param: torch.Tensor) -> None:
        step = self._step or self._begin_step()
        if pos in step.fired:
            step.twice = True
        step.fired.add(pos)
        b, i = self._where[pos]
        bucket = self._buckets[b]
        if not step.armed or b == len(self._buckets) - 1 or param.grad is None:
            return
        if bucket.launched:
            step.late = True  # stays in param.grad: the delta round picks it up
            return
        self._move(bucket, i, param, step.scale, add=pos in step.moved)
        step.moved.add(pos)
        bucket.ready += 1
        while step.next_launch < len(self._buckets) - 1:
            nxt = self._buckets[step.next_launch]
            if nxt.ready < len(nxt.params):
                break
            self._launch(nxt, nxt.buffer)
            step.next_launch += 1

    @staticmethod
    def _move(bucket: _Bucket, i: int, param: torch.Tensor, scale: float, add: bool) -> None:
        """Put scale * param.grad into its slice and take the gradient away from the parameter."""
        grad, view = param.grad, bucket.shaped[i]
        assert grad is not None
        if add:
            view.add_(grad, alpha=scale)
        elif _aliases(grad, view):
            view.mul_(scale)
        else:
            torch.mul(grad, scale, out=view)
        param.grad = None

    @staticmethod
    def _launch(bucket: _Bucket, target: torch.Tensor) -> None:
        with peer_failures("the gradient all-reduce"):
            bucket.work = dist.all_reduce(target, async_op=True)
        bucket.launched = True

    # ----- the reduction -------------------------------------------------------------------------
    def allreduce(
        self,
        params: list[torch.nn.Parameter],
        shape: StepShape,
        loss_reduction: str,
        pending: bool,
        collective: bool,
        bucket_bytes: int = BUCKET_BYTES,
    ) -> tuple[int, bool]:
        """Replace each grad by the sample-weighted global average; returns (global samples, any pending)."""
        buckets = self._layout(params, bucket_bytes)
        step = self._step or _Step()
        self._step = None
        armed = step.armed and collective
        scale = step.scale if armed else _scale(loss_reduction, shape.local_n, shape.total)
        try:
            for b, bucket in enumerate(buckets):
                if bucket.launched:
                    continue
                for i, (p, pos) in enumerate(zip(bucket.params, bucket.positions)):
                    if pos in step.moved:
                        continue
                    if p.grad is None or shape.local_n == 0:
                        bucket.shaped[i].zero_()
                    else:
                        self._move(bucket, i, p, scale, add=False)
                    bucket.ready += 1
                tail = b == len(buckets) - 1
                if tail:
                    mine = [float(v) for v in (shape.local_n, pending, step.twice or self._fresh, step.late)]
                    bucket.buffer[-_SLOTS:] = torch.tensor(mine, dtype=bucket.buffer.dtype)
                if collective:
                    self._launch(bucket, bucket.buffer if tail else bucket.buffer[: bucket.numel])
            with peer_failures("the gradient all-reduce"):
                for bucket in buckets:
                    if bucket.work is not None:
                        bucket.work.wait()
            slots = buckets[-1].buffer[-_SLOTS:].tolist()
            total, agreed, twice, late = float(slots[0]), slots[1] > 0, slots[2] > 0, slots[3] > 0
            if late:
                self._reduce_deltas(scale)
            want = _scale(loss_reduction, shape.local_n, shape.total)
            fix = (want / scale if scale else 1.0) * (max(shape.total, 1) / max(total, 1.0))
            for bucket in buckets:
                if fix != 1.0:
                    bucket.buffer[: bucket.numel].mul_(fix)
                for p, view in zip(bucket.params, bucket.shaped):
                    p.grad = view
        except BaseException:
            self.abandon()
            raise
        for bucket in buckets:
            bucket.work, bucket.launched, bucket.ready = None, False, 0
        self._overlap_ok = collective and not twice
        self._fresh = False
        self._guess = loss_reduction
        return round(total), agreed

    def _reduce_deltas(self, scale: float) -> None:
        """Gradients that arrived after their bucket left: every rank reduces its deltas (zeros if none)."""
        for bucket in self._buckets[:-1]:
            delta = torch.zeros(bucket.numel, dtype=bucket.buffer.dtype, device=bucket.buffer.device)
            offset = 0
            for p in bucket.params:
                if p.grad is not None:  # every other gradient of these buckets was moved into the buffer
                    delta[offset : offset + p.numel()].add_(p.grad.reshape(-1), alpha=scale)
                offset += p.numel()
            with peer_failures("the gradient all-reduce (late gradients)"):
                dist.all_reduce(delta)
            bucket.buffer[: bucket.numel].add_(delta)

    def abandon(self, keep_layout: bool = True) -> None:
        """Forget the step in flight (after a failure). Buffers a collective may still write are dropped."""
        self._step = None
        self._overlap_ok = False
        in_flight = any(b.work is not None and not b.work.is_completed() for b in self._buckets)
        for bucket in self._buckets:
            bucket.work, bucket.launched, bucket.ready = None, False, 0
        if keep_layout and not in_flight:
            return
        for handle in self._hooks:
            handle.remove()
        self._hooks, self._buckets, self._where, self._key = [], [], [], ()
