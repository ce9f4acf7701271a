"""The process group follows the coordinator's store: a `--rejoin` launcher serves a new one."""

from __future__ import annotations

import torch
import torch.distributed as dist

from elastrain.rendezvous.api import Cause, Generation, Member
from elastrain.runtime.group import GroupManager


def _generation(number: int, store: dist.TCPStore) -> Generation:
    member = Member("127.0.0.1#0", "127.0.0.1", 1, 0)
    return Generation(number, (member,), Cause.COORDINATOR_RESTART, f"127.0.0.1:{store.port}")


def test_a_new_generation_after_a_coordinator_restart_uses_the_new_store() -> None:
    old = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True)
    groups = GroupManager("gloo", 10.0, 0, "127.0.0.1")
    try:
        groups.build(_generation(1, old), 0)
        del old  # the killed launcher's store is gone; the replacement serves another one
        new = dist.TCPStore("127.0.0.1", 0, is_master=True, use_libuv=True)
        groups.build(_generation(2, new), 0)  # before the fix: the dead store's connection, forever
        value = torch.ones(3)
        dist.all_reduce(value)
        assert value.tolist() == [1.0, 1.0, 1.0] and groups.generation == 2
        assert new.num_keys() > 0  # the group met in the new store
    finally:
        groups.destroy()
