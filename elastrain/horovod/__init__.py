"""elastrain's implementation of Horovod's PyTorch API (``horovod.torch``). This is not Horovod.

Horovod itself (0.28.1, its last release) does not build against torch 2.x. This package gives
scripts written for ``import horovod.torch as hvd`` the same functions on top of elastrain's
elastic runtime; in the Horovod image (and in tests) the ``elastrain-horovod-compat`` shim makes
``import horovod.torch as hvd`` resolve here and provides the ``horovodrun`` command
(:mod:`elastrain.horovod.runner`, which runs ``elastrain run``). TensorFlow, Keras and MXNet are
not covered. Use it as ``import elastrain.horovod as hvd`` or through the shim.

How it maps onto elastrain
--------------------------
* ``hvd.init()`` connects the worker to the job's coordinator; the first call that needs it
  (``size()``, ``rank()``, a collective, ``hvd.elastic.run``) joins a *generation* (the set of workers
  training together), so a worker added by a resize loads its data before the others wait for it.
  ``size()``/``rank()`` are the generation's. A plain ``python script.py`` is a world of one.
* Collectives (``allreduce``, ``allgather``, ``broadcast``, ``broadcast_object``, ...) and
  ``DistributedOptimizer`` run over the generation's torch.distributed group (gloo on CPU, NCCL on GPU).
* ``hvd.elastic.run`` / ``TorchState`` / ``ElasticSampler`` map onto elastrain's live resize: when the
  hostfile (or discovery script) changes, elastrain announces a new generation, ``state.commit()``
  raises ``HostsUpdatedInterrupt`` on every rank at the same commit, the workers rejoin *in the same
  processes*, new workers receive the state, and the sampler splits what is left of the epoch over
  the new world (each sample once per epoch). Commits are elastrain committed steps: with
  ``horovodrun --ledger DIR`` they are written to elastrain's exactly-once ledger
  (``elastrain.report`` reads it).

Differences from Horovod
------------------------
* ``op=hvd.Adasum`` is refused (``NotImplementedError``); Average, Sum, Min, Max, Product work.
* Process sets other than the global one, ``alltoall``, ``reducescatter``, grouped allgather,
  ``SyncBatchNorm`` and sparse allreduce are not provided (sparse gradients need
  ``sparse_as_dense=True``). ``hvd.init(comm=...)`` (MPI) is refused.
* Collectives are matched by call order, not by ``name`` (names are ignored): every rank must issue
  the same collectives in the same order. Async handles complete at once except ``allreduce``.
* ``DistributedOptimizer`` reduces all gradients at ``step()``/``synchronize()`` in one flat buffer
  per dtype (no overlap with the backward pass); ``num_groups``/``groups`` are ignored. It shares
  the wrapped optimizer's state instead of starting a fresh one.
* ``join()`` waits for every rank and returns the last to join, but a joined rank does not stand in
  with zeros for collectives the others still run; ``ElasticSampler`` gives every rank the same
  number of steps, so ``join()`` is only needed at the end.
* ``broadcast_optimizer_state`` sends the ``state_dict`` (an empty state stays empty; Horovod runs a
  zero-gradient step first). It and the ``hvd.elastic`` state sync never unpickle code (``torch.load``
  with ``weights_only=True``), so ``ObjectState``/``TorchState`` attributes must be numbers, strings,
  tensors, numpy arrays or containers of them. ``broadcast_object``/``allgather_object`` take the
  same path by default (numbers, strings, bytes, tensors, numpy arrays and containers of them; another
  object is refused in one line); ``ELASTRAIN_HVD_ALLOW_PICKLE=1`` makes them pickle arbitrary objects
  with :mod:`pickle` as Horovod does (cloudpickle), trusting every sender; see ``docs/security.md``.
* ``TorchState.sync()`` sends the state of the member with the most commits (Horovod: rank 0), and
  only when the new generation needs it; plain attributes are deep-copied at each commit. A
  ``HostsUpdatedInterrupt`` raised by ``check_host_updates()`` also commits (Horovod keeps that
  progress without committing it), so a later failure does not roll back past it.
* ``ElasticSampler``: no padding at an epoch's last step once ``record_batch`` told it the batch
  size; ``set_epoch`` with the current epoch keeps the progress (see its module).
* ``local_rank()`` is the worker's slot on its host, fixed for the process's life (its GPU); after
  a resize the local ranks of a host need not be contiguous.
* A worker reports success to the coordinator when its process exits normally; an uncaught
  exception or ``sys.exit(non-zero)`` fails the job, as a crashed worker does. A worker that a
  scale-in removes leaves at a commit and exits with code 0 (Horovod stops its process).
* ``horovodrun`` resizes a job on ``--hostfile`` edits too (Horovod only polls a discovery script);
  see :mod:`elastrain.horovod.runner` for its flags.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from elastrain.horovod import elastic
    from elastrain.horovod.basics import (
        ccl_built,
        cross_rank,
        cross_size,
        cuda_built,
        ddl_built,
        gloo_built,
        gloo_enabled,
        init,
        is_homogeneous,
        is_initialized,
        local_rank,
        local_size,
        mpi_built,
        mpi_enabled,
        mpi_threads_supported,
        nccl_built,
        rank,
        rocm_built,
        shutdown,
        size,
        start_timeline,
        stop_timeline,
    )
    from elastrain.horovod.collectives import (
        allgather,
        allgather_async,
        barrier,
        broadcast,
        broadcast_,
        broadcast_async,
        broadcast_async_,
        join,
    )
    from elastrain.horovod.compression import Compression
    from elastrain.horovod.errors import HorovodInternalError, HostsUpdatedInterrupt
    from elastrain.horovod.functions import (
        allgather_object,
        broadcast_object,
        broadcast_optimizer_state,
        broadcast_parameters,
    )
    from elastrain.horovod.ops import (
        Adasum,
        Average,
        Max,
        Min,
        ProcessSet,
        Product,
        Sum,
        allreduce,
        allreduce_,
        allreduce_async,
        allreduce_async_,
        global_process_set,
        grouped_allreduce,
        grouped_allreduce_,
        poll,
        synchronize,
    )
    from elastrain.horovod.optimizer import DistributedOptimizer

__version__ = "0.28.1+elastrain"  # the Horovod API version this follows

_MODULES = {
    "elastrain.horovod.basics": (
        "ccl_built cross_rank cross_size cuda_built ddl_built gloo_built gloo_enabled init is_homogeneous "
        "is_initialized local_rank local_size mpi_built mpi_enabled mpi_threads_supported nccl_built rank "
        "rocm_built shutdown size start_timeline stop_timeline"
    ),
    "elastrain.horovod.compression": "Compression",
    "elastrain.horovod.errors": "HorovodInternalError HostsUpdatedInterrupt",
    "elastrain.horovod.functions": (
        "allgather_object broadcast_object broadcast_optimizer_state broadcast_parameters"
    ),
    "elastrain.horovod.collectives": (
        "allgather allgather_async barrier broadcast broadcast_ broadcast_async broadcast_async_ join"
    ),
    "elastrain.horovod.ops": (
        "Adasum Average Max Min ProcessSet Product Sum allreduce allreduce_ allreduce_async allreduce_async_ "
        "global_process_set grouped_allreduce grouped_allreduce_ poll synchronize"
    ),
    "elastrain.horovod.optimizer": "DistributedOptimizer",
}
_LAZY = {name: module for module, names in _MODULES.items() for name in names.split()}


def __getattr__(name: str) -> Any:
    """Load the implementing module on first use (``horovodrun`` needs none of them, nor torch)."""
    if name == "elastic":
        return importlib.import_module("elastrain.horovod.elastic")
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'elastrain.horovod' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)


__all__ = [
    "Adasum",
    "Average",
    "Compression",
    "DistributedOptimizer",
    "HorovodInternalError",
    "HostsUpdatedInterrupt",
    "Max",
    "Min",
    "ProcessSet",
    "Product",
    "Sum",
    "allgather",
    "allgather_async",
    "allgather_object",
    "allreduce",
    "allreduce_",
    "allreduce_async",
    "allreduce_async_",
    "barrier",
    "broadcast",
    "broadcast_",
    "broadcast_async",
    "broadcast_async_",
    "broadcast_object",
    "broadcast_optimizer_state",
    "broadcast_parameters",
    "ccl_built",
    "cross_rank",
    "cross_size",
    "cuda_built",
    "ddl_built",
    "elastic",
    "global_process_set",
    "gloo_built",
    "gloo_enabled",
    "grouped_allreduce",
    "grouped_allreduce_",
    "init",
    "is_homogeneous",
    "is_initialized",
    "join",
    "local_rank",
    "local_size",
    "mpi_built",
    "mpi_enabled",
    "mpi_threads_supported",
    "nccl_built",
    "poll",
    "rank",
    "rocm_built",
    "shutdown",
    "size",
    "start_timeline",
    "stop_timeline",
    "synchronize",
]
