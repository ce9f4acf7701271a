"""``hvd.DistributedOptimizer``: the wrapped optimizer's class, with gradients reduced before each step.

As in Horovod the result is an instance of a new subclass of the optimizer's own class (so
``isinstance(opt, torch.optim.SGD)`` holds and its ``param_groups`` are the original's). Gradients are
reduced over the *current* generation at ``step()``/``synchronize()``: the world size is read then,
so the optimizer keeps working across resizes. They travel as one flat buffer per dtype, in the order
of the parameter names (the same on every rank), after the backward pass (no overlap with it).
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import torch

from elastrain.horovod import basics
from elastrain.horovod.compression import Compression, Compressor
from elastrain.horovod.ops import (
    ADASUM_UNSUPPORTED,
    Adasum,
    Average,
    _check_process_set,
    _launch_allreduce,
    global_process_set,
    resolve_op,
    synchronize,
)

_TOO_MANY_PASSES = (
    "Gradients were computed more than backward_passes_per_step times before call to step(). "
    "Increase backward_passes_per_step to accumulate gradients locally."
)
_ZERO_GRAD_RACE = (
    "optimizer.zero_grad() was called after loss.backward() but before optimizer.step() or "
    "optimizer.synchronize(). This is prohibited as it can cause a race condition."
)


class _DistributedOptimizer(torch.optim.Optimizer):
    """The methods put in front of the wrapped optimizer's class (never instantiated by itself)."""

    _hvd_names: dict[torch.Tensor, str]
    _hvd_order: list[torch.Tensor]
    _hvd_compression: type[Compressor]
    _hvd_op: int
    _hvd_predivide: float
    _hvd_sparse_as_dense: bool
    _hvd_passes_per_step: int
    _hvd_passes: dict[int, int]
    _hvd_hooks: list[Any]
    _hvd_synchronized: bool
    _hvd_should_synchronize: bool

    def _hvd_setup(
        self,
        named_parameters: Iterable[tuple[str, torch.Tensor]] | None,
        compression: type[Compressor],
        backward_passes_per_step: int,
        op: int,
        gradient_predivide_factor: float,
        sparse_as_dense: bool,
    ) -> None:
        all_params = [p for group in self.param_groups for p in group["params"]]
        if named_parameters is not None:
            named = list(named_parameters)
            if any(not isinstance(p, tuple) for p in named):
                raise ValueError(
                    "named_parameters should be a sequence of tuples (name, parameter), usually produced "
                    "by model.named_parameters()."
                )
        else:
            named = [
                (f"allreduce.noname.{i}.{j}", p)
                for i, group in enumerate(self.param_groups)
                for j, p in enumerate(group["params"])
            ]
        names = [k for k, _ in named]
        dups = sorted({k for k in names if names.count(k) > 1})
        if dups:
            raise ValueError(
                f"Parameter names in named_parameters must be unique. Found duplicates: {', '.join(dups)}"
            )
        named_ids = {id(p) for _, p in named}
        unnamed = [id(p) for p in all_params if id(p) not in named_ids]
        if unnamed:
            raise ValueError(
                "named_parameters was specified, but one or more model parameters were not named. "
                f"Python object ids: {', '.join(str(i) for i in unnamed)}"
            )
        in_optimizer = {id(p) for p in all_params}
        ordered = sorted(((k, p) for k, p in named if id(p) in in_optimizer), key=lambda kv: kv[0])
        self._hvd_names = {p: k for k, p in ordered}
        self._hvd_order = [p for _, p in ordered]
        self._hvd_compression = compression
        self._hvd_op = op
        self._hvd_predivide = gradient_predivide_factor
        self._hvd_sparse_as_dense = sparse_as_dense
        self._hvd_passes_per_step = backward_passes_per_step
        self._hvd_passes = {}
        self._hvd_hooks = []
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True
        for p in self._hvd_order:
            if p.requires_grad:
                self._hvd_hooks.append(p.register_post_accumulate_grad_hook(self._hvd_count_pass))

    def _hvd_count_pass(self, param: torch.Tensor) -> None:
        passes = self._hvd_passes.get(id(param), 0)
        if passes >= self._hvd_passes_per_step:
            raise AssertionError(_TOO_MANY_PASSES)
        self._hvd_passes[id(param)] = passes + 1

    @property
    def backward_passes_per_step(self) -> int:
        """Backward passes accumulated locally before each reduction."""
        return self._hvd_passes_per_step

    def set_backward_passes_per_step(self, passes: int) -> None:
        """Change how many backward passes are accumulated before each reduction."""
        if passes <= 0:
            raise ValueError("backward_passes_per_step must be > 0")
        self._hvd_passes_per_step = passes
        self._hvd_passes.clear()

    def synchronize(self) -> None:
        """Reduce the gradients over all workers now (e.g. before clipping them)."""
        n = basics.size() if basics.is_initialized() else 1
        params = [p for p in self._hvd_order if p.requires_grad]
        if n > 1 and params:
            self._hvd_reduce(params)
        self._hvd_passes.clear()
        self._hvd_synchronized = True

    def _hvd_reduce(self, params: list[torch.Tensor]) -> None:
        compressed: list[tuple[torch.Tensor, torch.Tensor, Any]] = []
        for p in params:
            grad = p.grad
            if grad is None:  # not computed here; another rank may have it
                grad = torch.zeros_like(p)
            elif grad.is_sparse:
                if not self._hvd_sparse_as_dense:
                    raise NotImplementedError(
                        "sparse gradients are not supported; "
                        "pass sparse_as_dense=True to DistributedOptimizer"
                    )
                grad = grad.to_dense()
            tensor, ctx = self._hvd_compression.compress(grad.detach())
            compressed.append((p, tensor, ctx))
        buckets: dict[tuple[torch.dtype, torch.device], list[tuple[torch.Tensor, torch.Tensor, Any]]] = {}
        for item in compressed:
            buckets.setdefault((item[1].dtype, item[1].device), []).append(item)
        scaled = self._hvd_op == Average and self._hvd_predivide != 1.0
        pre, post = (1.0 / self._hvd_predivide, self._hvd_predivide) if scaled else (1.0, 1.0)
        # launch every bucket, then wait: dtypes (and devices) reduce concurrently
        launched = []
        for items in buckets.values():
            flat = torch.cat([t.reshape(-1) for _, t, _ in items])
            launched.append((items, flat, _launch_allreduce(flat, self._hvd_op, pre, post)))
        for items, flat, handle in launched:
            synchronize(handle)
            offset = 0
            for p, t, ctx in items:
                value = self._hvd_compression.decompress(flat[offset : offset + t.numel()].view_as(t), ctx)
                offset += t.numel()
                if p.grad is None:
                    p.grad = value.clone()
                elif p.grad.is_sparse:
                    p.grad = value.to_sparse()
                else:
                    p.grad.copy_(value)

    @contextmanager
    def skip_synchronize(self) -> Iterator[None]:
        """Inside it, ``step()`` does not reduce (use after an explicit ``synchronize()``)."""
        self._hvd_should_synchronize = False
        try:
            yield
        finally:
            self._hvd_should_synchronize = True

    def step(self, closure: Any = None) -> Any:
        """Reduce the gradients (unless inside ``skip_synchronize()``), then take the wrapped step."""
        if self._hvd_should_synchronize:
            if self._hvd_synchronized:
                warnings.warn(
                    "optimizer.step() called without optimizer.skip_synchronize() context after "
                    "optimizer.synchronize(). This can cause training slowdown. You may want to consider "
                    "using optimizer.skip_synchronize() context if you use optimizer.synchronize() in "
                    "your code.",
                    stacklevel=2,
                )
            self.synchronize()
        self._hvd_synchronized = False
        return super().step(closure)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """As the wrapped ``zero_grad``; refused between ``backward()`` and ``step()``, as in Horovod."""
        if self._hvd_passes:
            raise AssertionError(_ZERO_GRAD_RACE)
        super().zero_grad(set_to_none)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """As the wrapped ``load_state_dict``; forgets gradients counted since the last step."""
        self._hvd_passes.clear()
        self._hvd_synchronized = False
        self._hvd_should_synchronize = True
        super().load_state_dict(state_dict)


def DistributedOptimizer(
    optimizer: torch.optim.Optimizer,
    named_parameters: Iterable[tuple[str, torch.Tensor]] | None = None,
    compression: type[Compressor] = Compression.none,
    backward_passes_per_step: int = 1,
    op: int = Average,
    gradient_predivide_factor: float = 1.0,
    num_groups: int = 0,
    groups: Any = None,
    sparse_as_dense: bool = False,
    process_set: Any = global_process_set,
) -> torch.optim.Optimizer:
    """Wrap `optimizer` so that ``step()`` first reduces the gradients over all workers.

    `op`: ``hvd.Average`` (default) or ``hvd.Sum`` (or Min/Max/Product); ``hvd.Adasum`` is refused.
    `backward_passes_per_step`: backward passes accumulated locally before each reduction.
    `gradient_predivide_factor`: with Average, scale by 1/f before the sum and f/size after it.
    `num_groups`/`groups` are accepted and ignored (all gradients of a dtype travel together).
    """
    _check_process_set(process_set)
    if op == Adasum:
        raise NotImplementedError(ADASUM_UNSUPPORTED)
    op = resolve_op(op)
    if gradient_predivide_factor != 1.0 and op != Average:
        raise ValueError("gradient_predivide_factor not supported with op != Average")
    if backward_passes_per_step <= 0:
        raise ValueError("backward_passes_per_step must be > 0")
    if isinstance(optimizer, _DistributedOptimizer):
        raise ValueError("this optimizer is already a DistributedOptimizer")
    base = type(optimizer)
    cls: type[_DistributedOptimizer] = type(
        base.__name__, (_DistributedOptimizer, base), {"__module__": __name__}
    )
    wrapped = object.__new__(cls)
    wrapped.__dict__.update(optimizer.__dict__)  # same param_groups, state and hooks as the original
    wrapped._patch_step_function()  # the optimizer step hooks, as torch's __init__ would install them
    wrapped._hvd_setup(
        named_parameters,
        compression,
        backward_passes_per_step,
        op,
        gradient_predivide_factor,
        sparse_as_dense,
    )
    return wrapped


__all__ = ["DistributedOptimizer"]
