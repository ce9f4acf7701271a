"""``hvd.elastic.State``/``ObjectState``/``TorchState``: what survives a reset, on elastrain's runtime.

``commit()`` saves a copy of the state in memory and checks for host updates; ``restore()`` goes back
to it after a failed collective; ``sync()`` gives every member of a new generation the same state.

Mapped onto elastrain: every commit is also an elastrain *committed step* (written to the job's
exactly-once ledger when ``elastrain run --ledger`` / ``horovodrun --ledger`` asks for one, and
reported to the coordinator), and the host-update check is one agreement collective over the
generation (elastrain announces a new generation; all ranks stop at the same commit). ``sync()``
broadcasts from the member with the most commits (Horovod: from rank 0; here rank 0 may be a worker
that just joined), and only when the generation needs it (a new worker, or members at different
commits). Plain attributes are deep-copied at each commit (Horovod keeps references).

The sync never unpickles code (Horovod pickles): it goes through ``functions.broadcast_state``
(``torch.load(weights_only=True)`` on the receiving ranks), so ``ObjectState``/``TorchState``
attributes must be numbers, strings, tensors, numpy arrays or lists/tuples/dicts of them (numpy
values are tagged on the way, as elastrain's own ``State`` counters are); another object is refused
at the sync with a message naming the attribute.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from typing import Any

import torch

from elastrain.errors import ConfigError
from elastrain.horovod import basics
from elastrain.horovod.elastic.sampler import ElasticSampler
from elastrain.horovod.errors import HostsUpdatedInterrupt
from elastrain.horovod.functions import broadcast_state
from elastrain.horovod.ops import guard
from elastrain.runtime.progress import ProgressReporter
from elastrain.runtime.safe_load import decode_counters, encode_counters


class State:
    """Horovod's ``hvd.elastic.State``: commit/restore/sync plus reset callbacks.

    Subclasses implement ``save``/``restore`` (and may override ``sync``). Horovod's constructor
    arguments `bcast_object` and `get_rank` are accepted and unused.
    """

    def __init__(self, bcast_object: Any = None, get_rank: Any = None) -> None:
        self._reset_callbacks: list[Callable[[], None]] = []
        self._commits = 0  # elastrain's committed steps: the coordinator syncs from the most advanced
        self._synced_generation: int | None = None
        self._reported_generation: int | None = None
        self._progress = ProgressReporter()
        self._samples = 0  # samples the job processed (estimated from this rank's records)

    # ----- Horovod's API -------------------------------------------------------------------------
    def register_reset_callbacks(self, callbacks: list[Callable[[], None]]) -> None:
        """Call these after every reset (worker added or removed), before the state is synced."""
        self._reset_callbacks.extend(callbacks)

    def on_reset(self) -> None:
        """Run ``reset()`` and the reset callbacks (``hvd.elastic.run`` does, after rejoining)."""
        self.reset()
        for callback in self._reset_callbacks:
            callback()

    def commit(self) -> None:
        """Save the state in memory, then raise ``HostsUpdatedInterrupt`` if the workers are changing."""
        self.save()
        self._record_commit()
        self._check_host_updates(committed=True)

    def check_host_updates(self) -> None:
        """Raise ``HostsUpdatedInterrupt`` (on every rank at once) if a new generation is pending.

        The progress since the last commit is kept through the reset (as in Horovod), so here it is
        also committed first: a failure later does not roll back past it.
        """
        self._check_host_updates(committed=False)

    def _check_host_updates(self, committed: bool) -> None:
        rt = basics.runtime()
        if rt.rendezvous is None:
            return
        with guard("the host update check"):
            pending = rt.agree_pending(rt.pending())
        if pending:
            if not committed:
                self.save()
                self._record_commit()
            raise HostsUpdatedInterrupt(False, f"the workers are changing (after commit {self._commits})")

    def save(self) -> None:
        """Keep a copy of the state in memory."""
        raise NotImplementedError

    def restore(self) -> None:
        """Go back to the last ``save()``."""
        raise NotImplementedError

    def reset(self) -> None:
        """Called after a reset, before the callbacks and the sync."""

    def sync(self) -> None:
        """Give every worker of the current generation the same state (a collective)."""
        rt = basics.runtime()
        generation = rt.generation
        number = generation.number if generation is not None else 0
        if self._synced_generation == number:
            return
        n = rt.world_size
        if n > 1 and (generation is None or generation.sync_state):
            src = generation.src_rank if generation is not None else 0
            payload = broadcast_state(self._capture, src, "elastic state")
            if rt.rank != src:
                self._apply(payload)
        self._after_sync()
        self.save()
        self._synced_generation = number
        if generation is not None:
            rt.ledger.generation(number, rt.rank, n, self._commits, generation.cause.value)

    # ----- what sync() sends; subclasses add theirs -------------------------------------------------
    def _capture(self) -> dict[str, Any]:
        return {"commits": self._commits}

    def _apply(self, payload: dict[str, Any]) -> None:
        self._commits = int(payload["commits"])

    def _after_sync(self) -> None:
        """After a sync (and after a reset without one): e.g. re-split the samplers for the new world."""

    # ----- elastrain's bookkeeping of a commit ---------------------------------------------------------
    def _record_commit(self) -> None:
        rt = basics.runtime()
        generation = rt.generation
        epoch = getattr(self, "epoch", 0)
        epoch = epoch if isinstance(epoch, int) else 0
        if generation is not None:
            rt.ledger.committed(generation.number, epoch, self._commits, rt.world_size)
            if self._reported_generation != generation.number:
                self._reported_generation = generation.number
                if rt.rank == 0 and rt.rendezvous is not None:  # the generation's first step is done
                    rt.rendezvous.report_first_step(generation.number, time.time())
        self._commits += 1
        if rt.rendezvous is not None:
            rt.rendezvous.committed_step = self._commits
        if rt.rank == 0 and self._progress.due():
            hosts = sorted({m.host for m in generation.members}) if generation is not None else []
            self._progress.report(self._commits, epoch, rt.world_size, self._samples, None, hosts)


class ObjectState(State):
    """Horovod's ``ObjectState``: keyword arguments become attributes kept in sync."""

    def __init__(self, bcast_object: Any = None, get_rank: Any = None, **kwargs: Any) -> None:
        self._saved_state = copy.deepcopy(kwargs)
        for name, value in kwargs.items():  # the objects given, as in Horovod (the saved ones are copies)
            setattr(self, name, value)
        super().__init__(bcast_object, get_rank)

    def save(self) -> None:
        """Deep-copy the current values of the attributes."""
        self._saved_state = {name: copy.deepcopy(getattr(self, name)) for name in self._saved_state}

    def restore(self) -> None:
        """Set the attributes back to the saved values."""
        self._set_attrs()

    def _set_attrs(self) -> None:
        for name, value in self._saved_state.items():
            setattr(self, name, copy.deepcopy(value))

    def _capture(self) -> dict[str, Any]:
        attrs = {name: getattr(self, name) for name in self._saved_state}
        try:
            encoded = encode_counters(attrs)
        except ConfigError as exc:
            raise ConfigError(f"hvd.elastic state sync (sent without pickle): {exc}") from None
        return {**super()._capture(), "attrs": encoded}

    def _apply(self, payload: dict[str, Any]) -> None:
        super()._apply(payload)
        for name, value in decode_counters(payload["attrs"]).items():
            setattr(self, name, value)
            self._saved_state.setdefault(name, None)


class StateHandler:
    """Keeps one framework object of a ``TorchState`` (model, optimizer, sampler) saved and synced."""

    def __init__(self, value: Any) -> None:
        self.value = value
        self._saved: Any = copy.deepcopy(value.state_dict())

    def save(self) -> None:
        """Copy the object's ``state_dict``."""
        self._saved = copy.deepcopy(self.value.state_dict())

    def restore(self) -> None:
        """Load the saved ``state_dict``."""
        self.value.load_state_dict(copy.deepcopy(self._saved))

    def capture(self) -> Any:
        """What ``sync`` sends for this object."""
        return self.value.state_dict()

    def apply(self, payload: Any) -> None:
        """Load what ``sync`` received."""
        self.value.load_state_dict(payload)

    def after_sync(self) -> None:
        """Called after every sync."""

    def set_value(self, value: Any) -> None:
        """The attribute was assigned a new object: track it instead."""
        self.value = value
        self.save()


class ModelStateHandler(StateHandler):
    """A ``torch.nn.Module``."""


class OptimizerStateHandler(StateHandler):
    """A ``torch.optim.Optimizer``."""


class SamplerStateHandler(StateHandler):
    """An ``ElasticSampler``: re-split for the new world after every sync."""

    def after_sync(self) -> None:
        """What is left of the epoch, split over the new world."""
        self.value.reset()


_handler_registry: list[tuple[type, type[StateHandler]]] = [
    (torch.nn.Module, ModelStateHandler),
    (torch.optim.Optimizer, OptimizerStateHandler),
    (ElasticSampler, SamplerStateHandler),
]


def get_handler_registry() -> list[tuple[type, type[StateHandler]]]:
    """(type, handler class) pairs ``TorchState`` uses for its keyword arguments."""
    return _handler_registry


def set_handler_registry(registry: list[tuple[type, type[StateHandler]]]) -> None:
    """Replace the handler registry."""
    global _handler_registry
    _handler_registry = registry


def _get_handler(value: Any) -> StateHandler | None:
    for kind, handler in _handler_registry:
        if isinstance(value, kind):
            return handler(value)
    return None


class TorchState(ObjectState):
    """Horovod's ``TorchState``: models, optimizers and ``ElasticSampler``s plus plain attributes.

    ``TorchState(model, optimizer, train_sampler=sampler, epoch=1, batch=0)``: every keyword becomes an
    attribute; modules, optimizers and samplers are saved with their ``state_dict``.
    """

    def __init__(self, model: Any = None, optimizer: Any = None, **kwargs: Any) -> None:
        kwargs.update(model=model, optimizer=optimizer)
        handlers: dict[str, StateHandler] = {}
        rest: dict[str, Any] = {}
        for name, value in kwargs.items():
            handler = _get_handler(value)
            if handler is not None:
                handlers[name] = handler
            else:
                rest[name] = value
        self._handlers = handlers
        for name, handler in handlers.items():
            setattr(self, name, handler.value)
            if isinstance(handler.value, ElasticSampler):
                handler.value._on_processed = self._ledger_processed
        super().__init__(**rest)

    def __setattr__(self, name: str, value: Any) -> None:
        handlers = self.__dict__.get("_handlers")
        if handlers is not None and name in handlers and name in self.__dict__:
            handlers[name].set_value(value)
            if isinstance(value, ElasticSampler):
                value._on_processed = self._ledger_processed
        super().__setattr__(name, value)

    def save(self) -> None:
        """Copy every model, optimizer and sampler state and the plain attributes."""
        for handler in self._handlers.values():
            handler.save()
        super().save()

    def restore(self) -> None:
        """Go back to the last commit."""
        for handler in self._handlers.values():
            handler.restore()
        super().restore()

    def _capture(self) -> dict[str, Any]:
        return {**super()._capture(), "objects": {n: h.capture() for n, h in self._handlers.items()}}

    def _apply(self, payload: dict[str, Any]) -> None:
        for name, value in payload["objects"].items():
            self._handlers[name].apply(value)
        super()._apply(payload)

    def _after_sync(self) -> None:
        for handler in self._handlers.values():
            handler.after_sync()

    def _ledger_processed(self, epoch: int, indices: list[int]) -> None:
        if not basics.is_initialized():
            return
        rt = basics.runtime()
        self._samples += len(indices) * rt.world_size
        if rt.generation is not None:
            rt.ledger.processed(rt.generation.number, epoch, self._commits, indices)


__all__ = [
    "ModelStateHandler",
    "ObjectState",
    "OptimizerStateHandler",
    "SamplerStateHandler",
    "State",
    "StateHandler",
    "TorchState",
    "get_handler_registry",
    "set_handler_registry",
]
