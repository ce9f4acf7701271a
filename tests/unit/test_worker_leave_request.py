"""A worker's SIGTERM handler asks to leave without ever blocking: the handler runs on the main thread,
between two bytecodes of whatever it interrupted, which may be a frame holding the connection's send
lock (a join being sent). It only raises a flag; the heartbeat thread sends the request at once.
An agent's SIGTERM handler tells the coordinator its host's workers leave.

A real coordinator (its RPC server on 127.0.0.1), real worker and agent connections, one sleeper process.
"""

from __future__ import annotations

import signal
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


def test_an_agent_told_to_stop_tells_the_coordinator_its_host_leaves() -> None:
    """SIGTERM to an agent (its handler): the coordinator hears at once that the host's workers leave,
    and its worker gets SIGTERM."""
    import sys

    from elastrain.agent.agent import Agent, AgentConfig

    config = CoordinatorConfig(
        min_np=1, max_np=1, initial_np=1, join_grace_s=600.0, heartbeat_timeout_s=600.0
    )
    coordinator = Coordinator(config, "token", "127.0.0.1:1", lambda host: None)
    coordinator.set_hosts(parse_host_list("h1:1"))
    sleeper = [sys.executable, "-c", "import time; time.sleep(60)"]
    agent = Agent(AgentConfig(coordinator.address, "token", "h1", sleeper, prefix_output=False))
    try:
        proc = wait_until(lambda: agent.procs.get("h1#0"), 20.0, "the worker to be spawned")
        agent.told_to_stop()
        wait_until(lambda: "h1" in coordinator.machine.leaving_hosts, 10.0, "the host to be leaving")
        assert proc.wait(timeout=10) == -15  # SIGTERM: a graceful leave
        assert coordinator.workers["h1#0"].state == WorkerState.LEFT
    finally:
        agent.terminate_all(signal.SIGKILL)
        agent.client.close()
        coordinator.close()
