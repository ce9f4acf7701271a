"""The coordinator's machine when workers go: an agent says its host is leaving (SIGTERM to the agent:
scancel, preemption, a drain): the host's workers leave at once, their peers get the next generation
without waiting for the heartbeat bound, and nothing is started there until another agent connects;
a worker that exited with an error fails the job even when its connection closed first."""

from __future__ import annotations

from elastrain.rendezvous.api import Cause, WorkerState
from elastrain.rendezvous.effects import Closed, Identity
from elastrain.rendezvous.messages import (
    Heartbeat,
    Hello,
    JoinOutcome,
    Leave,
    PendingPush,
    Role,
    SpawnPush,
    StopPush,
)
from tests.unit.test_coordinator_machine import Script, agent_peer


def agent_leaves(s: Script, host: str) -> None:
    s.send(agent_peer(host), Identity(Role.AGENT, host), Leave())


def test_an_agent_told_to_stop_makes_its_workers_leave_and_its_peers_go_on_at_once() -> None:
    s = Script({"h1": 1, "h2": 1}, min_np=1, max_np=2, initial_np=2, heartbeat_timeout_s=30.0)
    s.agent("h1")
    s.agent("h2")
    s.running("h1#0", "h2#0")
    agent_leaves(s, "h2")  # h2#0's own SIGTERM handler has not run (it is inside a long C call)
    assert s.state("h2#0") == WorkerState.LEAVING
    assert s.machine.pending == Cause.SCALE_IN
    # both members hear of it now: the leaver stops at its next commit too, on the agent's word
    assert s.sent("w:h1#0", PendingPush) == [PendingPush(1, Cause.SCALE_IN)]
    assert s.sent("w:h2#0", PendingPush) == [PendingPush(1, Cause.SCALE_IN)]
    s.join("h1#0", step=6)
    s.join("h2#0", step=6)  # no clock advanced: no heartbeat bound was waited for
    generation = s.machine.generation
    assert generation is not None and generation.number == 1 and generation.cause == Cause.SCALE_IN
    assert [m.worker_id for m in generation.members] == ["h1#0"]
    reply = s.join_reply("h2#0")
    assert reply is not None and reply.outcome == JoinOutcome.LEAVE
    s.exited("h2#0", 0)
    assert s.state("h2#0") == WorkerState.LEFT


def test_nothing_is_started_on_a_leaving_host_until_another_agent_connects() -> None:
    s = Script({"h1": 1, "h2": 2}, min_np=1, max_np=3, initial_np=2)
    s.agent("h1")
    s.agent("h2")
    assert s.spawned("h2") == ["h2#0"]
    agent_leaves(s, "h2")
    s.join("h1#0", step=-1)
    s.tick(6.0)  # past the join grace: h1#0 trains alone, and max_np leaves room for two more
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0"]
    assert s.spawned("h2") == ["h2#0"]  # h2's free slots are not filled while its agent drains
    # a new agent on h2 (another pid: the node came back): the host takes workers again
    s.send("agent:h2-new", Identity(Role.AGENT, "h2"), Hello(id=99, role=Role.AGENT, host="h2", pid=8))
    assert "h2" not in s.machine.leaving_hosts
    assert [w.local_rank for p in s.sent("agent:h2-new", SpawnPush) for w in p.workers] == [0]


def test_a_leaving_host_retires_its_workers_that_have_not_joined_yet() -> None:
    s = Script({"h1": 1, "h2": 1}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.agent("h2")
    s.hello("h2#0")  # spawned and connected, not yet asking to join
    agent_leaves(s, "h2")
    assert s.state("h2#0") == WorkerState.LEFT
    assert s.sent(agent_peer("h2"), StopPush) == [StopPush(("h2#0",))]
    s.join("h1#0", step=-1)
    s.tick(10.0)  # past the join grace: h1#0 starts alone, h2 is not waited for
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0"]


def test_a_leave_after_the_job_ended_changes_nothing() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=1, initial_np=1)
    s.agent("h1")
    s.running("h1#0")
    s.exited("h1#0", 0)
    outcome = s.machine.outcome
    assert outcome is not None and outcome.success
    agent_leaves(s, "h1")
    assert s.machine.pending is None and s.machine.outcome is outcome


def test_a_worker_whose_connection_closed_before_its_exit_code_came_fails_the_job() -> None:
    """An uncaught exception (exit 1): the process's connection closes ~50 ms before its agent reports
    the code, so it is first taken for lost; the code then ends the job (it used to be ignored, and
    the job finished on fewer workers and reported success)."""
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.apply(Closed("w:h1#1", s.who("h1#1")))
    assert s.state("h1#1") == WorkerState.DEAD and s.machine.outcome is None
    s.exited("h1#1", 1)
    outcome = s.machine.outcome
    assert outcome is not None and not outcome.success and outcome.worker_id == "h1#1"
    assert "exited with code 1" in outcome.message


def test_a_lost_worker_killed_by_a_signal_does_not_fail_the_job() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.apply(Closed("w:h1#1", s.who("h1#1")))
    s.exited("h1#1", -9)
    assert s.machine.outcome is None and s.machine.pending == Cause.WORKER_FAILURE


def test_a_job_that_lost_a_worker_takes_the_free_slot_back_and_grows_again() -> None:
    s = Script({"h1": 2, "h2": 2}, min_np=2, max_np=4, initial_np=4, max_restarts=3)
    for host in ("h1", "h2"):
        s.agent(host)
    s.running("h1#0", "h1#1", "h2#0", "h2#1")
    s.exited("h2#1", -9)  # killed: its container (and agent) are still there
    assert s.spawned("h2") == ["h2#0", "h2#1", "h2#1.1"]  # taken back at once, not left free
    for wid in ("h1#0", "h1#1", "h2#0"):
        s.join(wid, step=5)  # the survivors go on at 3 meanwhile
    s.join("h2#1.1", step=-1)
    assert s.machine.pending == Cause.SCALE_OUT
    for wid in ("h1#0", "h1#1", "h2#0"):
        s.join(wid, step=9)
    generation = s.machine.generation
    assert generation is not None and generation.world_size == 4
    assert s.machine.slots.restarts == 1


def test_a_slot_lost_to_missed_heartbeats_is_not_refilled() -> None:
    """A hung worker (a frozen container) may still hold its slot (its GPU): nothing is spawned beside it."""
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2, heartbeat_timeout_s=10.0)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    for _ in range(11):
        s.clock.advance(1.0)
        s.send("w:h1#0", s.who("h1#0"), Heartbeat())
        s.tick()
    assert s.state("h1#1") == WorkerState.DEAD
    assert s.spawned("h1") == ["h1#0", "h1#1"]


def test_a_lost_slot_on_a_host_without_its_agent_is_not_refilled() -> None:
    s = Script({"h1": 1, "h2": 1}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.agent("h2")
    s.running("h1#0", "h2#0")
    s.apply(Closed(agent_peer("h2"), Identity(Role.AGENT, "h2")))  # the container went away
    s.apply(Closed("w:h2#0", s.who("h2#0")))
    assert s.spawned("h2") == ["h2#0"] and s.machine.slots.restarts == 0
