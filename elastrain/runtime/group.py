"""Build and tear down the torch.distributed process group of one generation, in the same process.

The group meets in the launcher's TCPStore (address and port from the generation, which the
coordinator sent over its token-authenticated channel), under a key prefix derived from the job
token: `store_prefix`. torch's store has no authentication; see ``docs/security.md``.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac
import logging
import os

import torch
import torch.distributed as dist

from elastrain.errors import ConfigError
from elastrain.rendezvous.api import Generation
from elastrain.rendezvous.wire import parse_address
from elastrain.runtime.collective import peer_failures

log = logging.getLogger("elastrain.group")


def store_prefix(token: str, generation: int) -> str:
    """The store keys of `generation` live under ``elastrain/<secret>/g<N>/``: secret = HMAC(token)[:16].

    Defense in depth, not authentication: a client that reaches the store without the job token
    cannot address the job's keys by their well-known names (``elastrain/g1/...``, torch's own), but
    torch's store answers ``list_keys`` to anyone, so it is no secret from a client that lists them.
    The store is protected by where it listens (the cluster address only, an ephemeral port).
    """
    secret = hmac.new(token.encode(), b"elastrain/store", hashlib.sha256).hexdigest()[:16]
    return f"elastrain/{secret}/g{generation}"


def choose_backend(requested: str) -> str:
    """gloo on CPU; NCCL when CUDA is available and not overridden."""
    if requested:
        return requested
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def worker_gpu(backend: str, local_rank: int) -> int | None:
    """The CUDA device of the worker in slot `local_rank` (None without CUDA): one GPU per slot, round
    robin under gloo (workers may share a GPU); under NCCL a slot beyond the GPUs is refused, since NCCL
    cannot put two ranks of a group on one device."""
    if not torch.cuda.is_available():
        if backend == "nccl":
            raise ConfigError(
                "ELASTRAIN_BACKEND=nccl but CUDA is not available to this worker: set ELASTRAIN_BACKEND=gloo "
                "or run on a host whose GPUs this process can see"
            )
        return None
    count = torch.cuda.device_count()
    if backend == "nccl" and local_rank >= count:
        raise ConfigError(
            f"NCCL needs a GPU per worker: this host has {count} and this is worker slot {local_rank}; "
            f"give the host at most {count} slots in the hostfile, or set ELASTRAIN_BACKEND=gloo to share"
        )
    return local_rank % count


class GroupManager:
    """Owns the default process group; one store connection reused across generations."""

    def __init__(
        self, backend: str, timeout_s: float, local_rank: int, host: str = "", token: str = ""
    ) -> None:
        self.backend = choose_backend(backend)
        self._token = token  # the job's: the store's key prefix derives from it
        self._bind_interface(host)
        self.timeout = datetime.timedelta(seconds=timeout_s)
        self.local_rank = local_rank
        self._store: dist.TCPStore | None = None
        self._store_address = ""
        self.generation: int | None = None
        self._gpu = worker_gpu(self.backend, local_rank)
        if self._gpu is not None:
            torch.cuda.set_device(self._gpu)

    def _bind_interface(self, host: str) -> None:
        """gloo binds the interface holding this host's address (e.g. a veth in the host's namespace).

        Without it gloo binds the hostname's address, which peers in other namespaces cannot reach.
        """
        from elastrain.runtime.netaddr import interface_for

        if self.backend == "gloo" and "GLOO_SOCKET_IFNAME" not in os.environ:
            interface = interface_for(host)
            if interface is not None:
                os.environ["GLOO_SOCKET_IFNAME"] = interface  # read by gloo when a group is created

    @property
    def device(self) -> torch.device:
        """Where the runtime's own collectives run: the local GPU for NCCL, the CPU for gloo (gloo has
        no CUDA all_gather, which the Horovod API's gathers need)."""
        if self.backend == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    @property
    def training_device(self) -> torch.device:
        """Where a worker's model and batches belong: its GPU whenever CUDA is available (NCCL, or gloo
        on CUDA tensors: several workers sharing one GPU), else the CPU."""
        if self._gpu is not None:
            return torch.device("cuda", self._gpu)
        return torch.device("cpu")

    def build(self, generation: Generation, rank: int) -> None:
        """Create the default group for `generation` (a fresh store prefix per generation, `store_prefix`).

        A failure to reach the store or the peers raises `PeerFailure` (the loop rejoins).
        """
        self.destroy()
        try:
            with peer_failures(f"building the process group of generation {generation.number}"):
                if self._store is None or self._store_address != generation.store_address:
                    host, port = parse_address(generation.store_address)
                    self._store = dist.TCPStore(
                        host, port, is_master=False, timeout=self.timeout, use_libuv=True
                    )
                    self._store_address = generation.store_address
                store = dist.PrefixStore(store_prefix(self._token, generation.number), self._store)
                dist.init_process_group(
                    self.backend,
                    store=store,
                    rank=rank,
                    world_size=generation.world_size,
                    timeout=self.timeout,
                )
        except Exception:
            # The store connection may be the broken one: a restarted coordinator (`--rejoin`) serves
            # a new store, possibly at the same address. Reconnect for the next generation.
            self._store = None
            raise
        self.generation = generation.number

    def destroy(self) -> None:
        """Tear down the current group; safe after a peer died (aborts NCCL communicators first)."""
        if not dist.is_initialized():
            return
        try:
            if self.backend == "nccl":
                abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
                if abort is not None:
                    abort()
                    return
            dist.destroy_process_group()
        except Exception as exc:  # a broken group may fail to shut down cleanly; it is gone either way
            log.debug("destroying the process group: %s", exc)
        self.generation = None
