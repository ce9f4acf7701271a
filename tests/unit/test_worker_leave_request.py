"""A worker's SIGTERM handler asks to leave without ever blocking: the handler runs on the main thread,
between two bytecodes of whatever it interrupted, which may be a frame holding the connection's send
lock (a join being sent). It only raises a flag; the heartbeat thread sends the request at once.

A real coordinator (its RPC server on 127.0.0.1) and a real worker connection; no processes.
"""

from __future__ import annotations

import time

from elastrain.hostfile import parse_host_list
from elastrain.rendezvous.api import WorkerState
from elastrain.rendezvous.client import CoordinatorRendezvous
from elastrain.rendezvous.coordinator import Coordinator
from elastrain.rendezvous.records import CoordinatorConfig
from elastrain.testing.waits import wait_until


def test_request_leave_returns_while_the_send_lock_is_held_and_the_leave_arrives_after() -> None:
    config = CoordinatorConfig(
        min_np=1, max_np=1, initial_np=1, join_grace_s=600.0, heartbeat_timeout_s=600.0
    )
    coordinator = Coordinator(config, "token", "127.0.0.1:1", lambda host: None)
    coordinator.set_hosts(parse_host_list("h1:1"))
    rendezvous = CoordinatorRendezvous(coordinator.address, "token", "h1#0", "h1", 0, heartbeat_s=30.0)
    try:
        wait_until(lambda: "h1#0" in coordinator.workers, 10.0, "the worker's hello")
        send_lock = rendezvous._rpc._client.conn._send_lock
        with send_lock:  # the interrupted frame was sending: the handler runs with the lock held
            began = time.monotonic()
            rendezvous.request_leave()
            returned_in = time.monotonic() - began
        assert returned_in < 1.0  # it returned (before, it waited forever on the lock it interrupted)
        # sent by the heartbeat thread at once, not at the next beat (30 s away)
        wait_until(lambda: coordinator.workers["h1#0"].state == WorkerState.LEFT, 10.0, "the leave")
    finally:
        rendezvous.close()
        coordinator.close()
