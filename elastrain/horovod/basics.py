"""``hvd.init()``, ``size()``, ``rank()``...: this worker's place in the current generation of the job.

Under ``horovodrun``/``elastrain run`` a worker is one member of elastrain's current *generation*:
``init()`` connects to the job's coordinator; the first call that needs the generation (``size()``,
``rank()``, a collective, ``hvd.elastic.run``) joins the first one the worker is admitted to. So a
worker added by a scale-out loads its data before it joins, while the others still train (Horovod's
``init()`` blocks in the rendezvous instead). ``size()`` and ``rank()`` change only at a reset inside
``hvd.elastic.run``. Run as a plain script, a worker is a world of one.

When the process ends normally the worker tells the coordinator it is done (the job succeeds when
every member is); an uncaught exception or ``sys.exit(non-zero)`` does not, so the job fails.
"""

from __future__ import annotations

import atexit
import importlib
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from elastrain.horovod.errors import HorovodInternalError

if TYPE_CHECKING:
    from elastrain.rendezvous.api import Generation, Member
    from elastrain.runtime.connection import Runtime

_NOT_INITIALIZED = "Horovod has not been initialized; use hvd.init()."


@dataclass
class _Session:
    """Process-wide: the runtime, and how the process is ending."""

    runtime: Runtime | None = None
    initialized: bool = False
    joined: bool = False  # in a generation (or a plain script: nothing to join)
    finished: bool = False  # the coordinator was told (done, or left): the worker cannot take part again
    failed: bool = False  # an uncaught exception is ending the process
    exit_code: Any = None  # the argument of the last sys.exit()
    hooks: bool = False


_SESSION = _Session()


def init(comm: Any = None, process_sets: Any = None) -> None:
    """Connect to the job (idempotent); the worker joins a generation when one is first needed.

    `comm` (an MPI communicator or a list of ranks) and `process_sets` are not supported: there is
    no MPI, and every collective runs over the whole current generation.
    """
    if comm is not None or process_sets not in (None, [], ()):
        raise NotImplementedError(
            "hvd.init(comm=..., process_sets=...): elastrain's Horovod API has no MPI communicators or "
            "process sets; call hvd.init() and use the global process set"
        )
    if _SESSION.initialized:
        return
    if _SESSION.finished:
        raise HorovodInternalError(
            "hvd.init() after hvd.shutdown(): this worker already left its elastrain job and cannot rejoin"
        )
    from elastrain.runtime.connection import init as runtime_init

    rt = runtime_init()
    _SESSION.runtime = rt
    if rt.rendezvous is not None:
        _install_exit_hooks()
        _warm_up()
    _SESSION.joined = rt.rendezvous is None
    _SESSION.initialized = True


def _warm_up() -> None:
    """Import now what torch loads on the first optimizer (its compiler: seconds), before joining.

    Horovod scripts create the optimizer after ``hvd.init()``; a worker added by a resize would
    otherwise make the running workers wait for this import.
    """
    try:
        importlib.import_module("torch._dynamo")
    except Exception:  # an optional part of torch: nothing to warm up
        return


def join_generation(rt: Runtime, committed_step: int) -> None:
    """Enter the next generation (blocks until the coordinator forms it); exits if told to leave."""
    try:
        rt.ensure_group(committed_step)
    except SystemExit:
        _SESSION.finished = True  # the runtime said goodbye to the coordinator and closed itself
        raise


def shutdown() -> None:
    """Leave the job: tell the coordinator this worker is done and release the process group."""
    rt = _SESSION.runtime
    if not _SESSION.initialized or rt is None:
        return
    _SESSION.initialized = False
    if rt.rendezvous is not None and not _SESSION.finished:
        _SESSION.finished = True
        rt.finish()


def is_initialized() -> bool:
    """True between ``init()`` and ``shutdown()``."""
    return _SESSION.initialized


def runtime() -> Runtime:
    """The elastrain runtime behind the API (``ValueError`` before ``init()``, as in Horovod)."""
    rt = _SESSION.runtime
    if not _SESSION.initialized or rt is None:
        raise ValueError(_NOT_INITIALIZED)
    if not _SESSION.joined:
        join_generation(rt, -1)  # the first generation this worker is admitted to
        _SESSION.joined = True
    return rt


def size() -> int:
    """Number of workers in the current generation."""
    return runtime().world_size


def rank() -> int:
    """This worker's rank in the current generation (0 .. size()-1)."""
    return runtime().rank


def local_rank() -> int:
    """This worker's slot on its host: fixed for the life of the process (it picks the GPU).

    After a resize the local ranks of a host need not be contiguous (Horovod renumbers them).
    """
    rt = _SESSION.runtime
    if not _SESSION.initialized or rt is None:
        raise ValueError(_NOT_INITIALIZED)
    return rt.context.local_rank  # known before joining: the GPU can be pinned first


def _members() -> tuple[Generation | None, list[Member]]:
    rt = runtime()
    generation = rt.generation
    return generation, list(generation.members) if generation is not None else []


def local_size() -> int:
    """Number of workers of the current generation on this worker's host."""
    generation, members = _members()
    if generation is None:
        return 1
    mine = members[runtime().rank].host
    return sum(1 for m in members if m.host == mine)


def _local_ranks(members: list[Member]) -> list[int]:
    """Each member's index among the members of its host, in rank order."""
    seen: dict[str, int] = {}
    out = []
    for m in members:
        out.append(seen.get(m.host, 0))
        seen[m.host] = out[-1] + 1
    return out


def cross_rank() -> int:
    """This host's index among the hosts that have a worker with this worker's local index."""
    generation, members = _members()
    if generation is None:
        return 0
    me = runtime().rank
    index = _local_ranks(members)
    peers = [r for r, i in enumerate(index) if i == index[me]]
    return peers.index(me)


def cross_size() -> int:
    """Number of hosts that have a worker with this worker's local index (the hosts, when even)."""
    generation, members = _members()
    if generation is None:
        return 1
    index = _local_ranks(members)
    return index.count(index[runtime().rank])


def is_homogeneous() -> bool:
    """True when every host of the current generation runs the same number of workers."""
    _, members = _members()
    counts: dict[str, int] = {}
    for m in members:
        counts[m.host] = counts.get(m.host, 0) + 1
    return len(set(counts.values())) <= 1


# ----- what is "built" ----------------------------------------------------------------------------
def mpi_built() -> bool:
    """No MPI: collectives run over torch.distributed."""
    return False


def mpi_enabled() -> bool:
    """No MPI."""
    return False


def mpi_threads_supported() -> bool:
    """No MPI."""
    return False


def gloo_built() -> bool:
    """torch.distributed's gloo backend carries the collectives on CPU."""
    import torch.distributed as dist

    return bool(dist.is_available() and dist.is_gloo_available())


def gloo_enabled() -> bool:
    """True when the current process group is a gloo one (the CPU default)."""
    rt = _SESSION.runtime
    return rt is not None and rt.groups.backend == "gloo"


def nccl_built() -> bool:
    """True when torch can run NCCL collectives here (CUDA present)."""
    import torch
    import torch.distributed as dist

    return bool(torch.cuda.is_available() and dist.is_available() and dist.is_nccl_available())


def cuda_built() -> bool:
    """True when torch sees CUDA."""
    import torch

    return bool(torch.cuda.is_available())


def rocm_built() -> bool:
    """Not supported."""
    return False


def ddl_built() -> bool:
    """Not supported."""
    return False


def ccl_built() -> bool:
    """Not supported."""
    return False


def start_timeline(file_path: str, mark_cycles: bool = False) -> None:
    """Accepted and ignored: there is no Horovod timeline."""


def stop_timeline() -> None:
    """Accepted and ignored: there is no Horovod timeline."""


# ----- ending the process ---------------------------------------------------------------------------
def _install_exit_hooks() -> None:
    """Report done at a normal exit; remember uncaught exceptions and sys.exit codes to tell them apart."""
    if _SESSION.hooks:
        return
    _SESSION.hooks = True
    previous_hook = sys.excepthook
    previous_exit = sys.exit

    def excepthook(kind: type[BaseException], value: BaseException, tb: Any) -> None:
        _SESSION.failed = True
        previous_hook(kind, value, tb)

    def exit_(code: Any = None) -> Any:
        _SESSION.exit_code = code
        return previous_exit(code)

    sys.excepthook = excepthook
    sys.exit = exit_
    atexit.register(_at_exit)


def _at_exit() -> None:
    rt = _SESSION.runtime
    if rt is None or rt.rendezvous is None or _SESSION.finished:
        return
    _SESSION.finished = True
    code = _SESSION.exit_code
    if _SESSION.failed or not (code is None or code == 0):
        rt.shutdown()  # the agent reports the exit code; the coordinator fails the job
        return
    try:
        rt.finish()
    except Exception as exc:  # the coordinator may be gone already: nothing left to tell
        print(f"elastrain: could not report this worker done: {exc}", file=sys.stderr)
