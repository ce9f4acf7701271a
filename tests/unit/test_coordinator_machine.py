"""The coordinator's state machine, scripted: events in, effects out, a fake clock, no sockets or threads.

Each test drives `CoordinatorMachine` through one transition of the generation cycle (first generation,
join grace, pending announcement, scale-out and scale-in, worker loss, heartbeat fencing, adoption,
restart budget, timeouts, finishing) and checks the effects it asks the shell to carry out.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from elastrain.rendezvous.api import Cause, Generation, Member, WorkerState
from elastrain.rendezvous.effects import (
    Abort,
    Closed,
    Effect,
    FakeClock,
    Finish,
    HostsChanged,
    Identity,
    Received,
    RecordEvent,
    Reply,
    ReportIncident,
    Send,
    StartAgent,
    Tick,
)
from elastrain.rendezvous.journal import EventKind
from elastrain.rendezvous.machine import CoordinatorMachine
from elastrain.rendezvous.messages import (
    Done,
    ExitPush,
    FencedPush,
    Heartbeat,
    Hello,
    Join,
    JoinOutcome,
    JoinReply,
    Leave,
    Ok,
    PendingPush,
    Progress,
    Refused,
    Rejoin,
    Request,
    Role,
    SpawnPush,
    StopPush,
    Unknown,
    UserError,
    WorkerExited,
)
from elastrain.rendezvous.records import CoordinatorConfig

_ids = itertools.count(1)


def agent_peer(host: str) -> str:
    return f"agent:{host}"


class Script:
    """One machine, a fake clock, and every effect it produced (peers are plain strings)."""

    def __init__(self, hosts: dict[str, int] | None = None, **config: Any) -> None:
        defaults: dict[str, Any] = {
            "min_np": 1,
            "max_np": 2,
            "initial_np": 2,
            "join_grace_s": 5.0,
            "start_timeout_s": 60.0,
            "elastic_timeout_s": 30.0,
            "heartbeat_timeout_s": 10.0,
            "max_restarts": 3,
            "run_id": "run-1",
        }
        self.clock = FakeClock()
        self.machine = CoordinatorMachine(CoordinatorConfig(**(defaults | config)), "store:1", self.clock)
        self.effects: list[Effect] = []
        self.peer_of: dict[str, str] = {}  # worker id -> its current peer
        if hosts is not None:
            self.apply(HostsChanged(hosts))

    # ----- inputs -------------------------------------------------------------------------------
    def apply(self, event: Any) -> list[Effect]:
        out = self.machine.handle(event)
        self.effects.extend(out)
        return out

    def send(self, peer: str, who: Identity, msg: Request) -> list[Effect]:
        return self.apply(Received(peer, who, msg))

    def who(self, wid: str) -> Identity:
        return Identity(Role.WORKER, wid.partition("#")[0], wid, "10.0.0.1")

    def agent(self, host: str) -> list[Effect]:
        who = Identity(Role.AGENT, host)
        return self.send(agent_peer(host), who, Hello(id=next(_ids), role=Role.AGENT, host=host, pid=7))

    def hello(self, wid: str, peer: str | None = None, rejoin: Rejoin | None = None) -> list[Effect]:
        peer = peer or f"w:{wid}"
        self.peer_of[wid] = peer
        host, _, rank = wid.partition("#")
        msg = Hello(
            id=next(_ids),
            role=Role.WORKER,
            host=host,
            worker_id=wid,
            local_rank=int(rank.split(".")[0]),
            pid=100,
            rejoin=rejoin,
        )
        return self.send(peer, self.who(wid), msg)

    def join(self, wid: str, step: int = 0) -> list[Effect]:
        if wid not in self.peer_of:
            self.hello(wid)
        return self.send(self.peer_of[wid], self.who(wid), Join(id=next(_ids), committed_step=step))

    def exited(self, wid: str, code: int) -> list[Effect]:
        host = wid.partition("#")[0]
        msg = WorkerExited(id=None, worker_id=wid, returncode=code)
        return self.send(agent_peer(host), Identity(Role.AGENT, host), msg)

    def tick(self, seconds: float = 0.0) -> list[Effect]:
        self.clock.advance(seconds)
        return self.apply(Tick())

    def running(self, *wids: str, step: int = 0) -> Generation:
        for wid in wids:
            self.join(wid, step)
        generation = self.machine.generation
        assert generation is not None and [m.worker_id for m in generation.members] == list(wids)
        return generation

    # ----- outputs ------------------------------------------------------------------------------
    def sent(self, peer: str, kind: type | None = None) -> list[Any]:
        return [
            e.message
            for e in self.effects
            if isinstance(e, Send) and e.peer == peer and (kind is None or isinstance(e.message, kind))
        ]

    def replies(self, peer: str) -> list[Any]:
        return [e.body for e in self.effects if isinstance(e, Reply) and e.peer == peer]

    def join_reply(self, wid: str) -> JoinReply | None:
        found = [r for r in self.replies(self.peer_of[wid]) if isinstance(r, JoinReply)]
        return found[-1] if found else None

    def spawned(self, host: str) -> list[str]:
        return [w.worker_id for p in self.sent(agent_peer(host), SpawnPush) for w in p.workers]

    def records(self, kind: EventKind) -> list[dict[str, Any]]:
        return [e.record for e in self.effects if isinstance(e, RecordEvent) and e.record["event"] == kind]

    def state(self, wid: str) -> WorkerState:
        return self.machine.workers[wid].state


def started(script: Script) -> list[str]:
    return [e.host for e in script.effects if isinstance(e, StartAgent)]


# ----- first generation ---------------------------------------------------------------------------
def test_first_generation_starts_agents_spawns_and_admits() -> None:
    s = Script({"h1": 1, "h2": 1})
    assert started(s) == ["h1", "h2"]
    s.agent("h1")
    s.agent("h2")
    assert s.spawned("h1") == ["h1#0"] and s.spawned("h2") == ["h2#0"]
    s.join("h1#0", step=-1)
    assert s.machine.generation is None  # one of the two initial workers
    s.join("h2#0", step=-1)
    generation = s.machine.generation
    assert generation is not None and generation.number == 0 and generation.cause == Cause.START
    for wid in ("h1#0", "h2#0"):
        reply = s.join_reply(wid)
        assert reply is not None and reply.outcome == JoinOutcome.ADMITTED and reply.generation == generation
        assert s.state(wid) == WorkerState.ACTIVE
    (record,) = s.records(EventKind.GENERATION)
    assert record["world_size"] == 2 and record["cause"] == "start" and record["run"] == "run-1"
    assert reply.to_wire()["outcome"] == "admitted"


def test_join_grace_admits_the_ready_ones_after_the_grace() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2, join_grace_s=5.0)
    s.agent("h1")
    s.join("h1#0")  # h1#1 was spawned but never asks to join
    s.tick(4.0)
    assert s.machine.generation is None
    s.tick(2.0)
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0"]


def test_start_timeout_fails_the_job_when_min_np_never_ready() -> None:
    s = Script({"h1": 2}, min_np=2, max_np=2, initial_np=2, start_timeout_s=60.0)
    s.agent("h1")
    s.join("h1#0")
    s.tick(59.0)
    assert s.machine.outcome is None
    s.tick(2.0)
    outcome = s.machine.outcome
    assert outcome is not None and not outcome.success and "only 1 of the 2 workers" in outcome.message
    assert any(isinstance(e, Finish) for e in s.effects)
    assert s.sent(agent_peer("h1"), ExitPush) == [ExitPush(success=False)]


def test_min_np_ready_at_the_start_bound_start_the_job_within_the_join_grace() -> None:
    s = Script({"h1": 3}, min_np=2, max_np=3, initial_np=3, start_timeout_s=60.0, join_grace_s=5.0)
    s.agent("h1")
    s.tick(58.0)  # a slow start-up: two workers ready just before the bound, the third still starting
    s.join("h1#0")
    s.join("h1#1")
    s.hello("h1#2")
    s.tick(3.0)
    assert s.machine.outcome is None
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0", "h1#1"]


# ----- pending announcement -----------------------------------------------------------------------
def test_pending_is_announced_to_active_members_but_not_to_stopped_ones() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    # h1#0 stops without an announcement (a collective failed): a peer is gone
    s.join("h1#0", step=5)
    assert s.machine.pending == Cause.WORKER_FAILURE
    assert s.sent("w:h1#1", PendingPush) == [PendingPush(1, Cause.WORKER_FAILURE)]
    assert s.sent("w:h1#0", PendingPush) == []  # the soak bug: a late push would stop it again
    s.join("h1#1", step=5)
    generation = s.machine.generation
    assert generation is not None and generation.number == 1 and generation.world_size == 2
    assert s.machine.pending is None


def test_a_new_generation_waits_for_every_active_member_to_stop() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.apply(Closed("w:h1#1", s.who("h1#1")))  # lost
    assert s.state("h1#1") == WorkerState.DEAD
    assert s.machine.generation is not None and s.machine.generation.number == 0  # h1#0 still active
    s.join("h1#0", step=3)
    generation = s.machine.generation
    assert generation is not None and generation.number == 1
    assert [m.worker_id for m in generation.members] == ["h1#0"]


# ----- scale-out and scale-in ---------------------------------------------------------------------
def test_scale_out_when_a_host_is_added() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=2, initial_np=1)
    s.agent("h1")
    s.running("h1#0")
    s.apply(HostsChanged({"h1": 1, "h2": 1}))
    assert started(s) == ["h1", "h2"]
    s.agent("h2")
    assert s.spawned("h2") == ["h2#0"]
    s.join("h2#0", step=-1)
    assert s.state("h2#0") == WorkerState.WAITING
    assert s.machine.pending == Cause.SCALE_OUT
    assert s.sent("w:h1#0", PendingPush) == [PendingPush(1, Cause.SCALE_OUT)]
    s.join("h1#0", step=7)
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0", "h2#0"]
    assert generation.src_rank == 0 and generation.sync_state
    assert s.join_reply("h2#0") == JoinReply(JoinOutcome.ADMITTED, generation=generation)


def test_scale_out_waits_for_starting_workers_within_the_join_grace() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=3, initial_np=1, join_grace_s=5.0)
    s.agent("h1")
    s.running("h1#0")
    s.apply(HostsChanged({"h1": 1, "h2": 2}))
    s.agent("h2")
    s.join("h2#0")  # h2#1 is still starting
    assert s.machine.pending is None
    s.tick(6.0)
    assert s.machine.pending == Cause.SCALE_OUT


def test_scale_in_when_a_host_is_removed() -> None:
    s = Script({"h1": 1, "h2": 1}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.agent("h2")
    s.running("h1#0", "h2#0")
    s.apply(HostsChanged({"h1": 1}))
    assert s.state("h2#0") == WorkerState.LEAVING and s.machine.pending == Cause.SCALE_IN
    assert s.sent("w:h2#0", PendingPush) == [PendingPush(1, Cause.SCALE_IN)]
    s.join("h1#0", step=4)
    assert s.machine.generation is not None and s.machine.generation.number == 0  # h2#0 not at its commit
    s.join("h2#0", step=4)
    assert s.join_reply("h2#0") == JoinReply(JoinOutcome.LEAVE, "scale-in")
    assert s.state("h2#0") == WorkerState.LEFT
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0"]
    assert generation.cause == Cause.SCALE_IN
    s.exited("h2#0", 0)  # its agent reports the exit; the host is gone and nothing runs there
    s.tick()
    assert s.sent(agent_peer("h2"), ExitPush) == [ExitPush(success=True)]
    assert "h2" not in s.machine.agents


def test_a_waiting_worker_on_a_removed_host_is_told_to_leave_and_stopped() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=3, initial_np=1)
    s.agent("h1")
    s.running("h1#0")
    s.apply(HostsChanged({"h1": 1, "h2": 2}))
    s.agent("h2")
    s.join("h2#0")  # waiting (h2#1 still starting, inside the grace)
    s.apply(HostsChanged({"h1": 1}))
    assert s.join_reply("h2#0") == JoinReply(JoinOutcome.LEAVE, "host removed")
    assert s.state("h2#0") == WorkerState.LEFT and s.state("h2#1") == WorkerState.LEFT
    assert StopPush(("h2#0",)) in s.sent(agent_peer("h2"))


def test_leave_request_forms_a_generation_without_the_worker_and_frees_its_slot() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.send("w:h1#1", s.who("h1#1"), Leave())
    assert s.state("h1#1") == WorkerState.LEAVING and s.machine.pending == Cause.SCALE_IN
    s.join("h1#0")
    s.join("h1#1")
    assert s.join_reply("h1#1") == JoinReply(JoinOutcome.LEAVE, "scale-in")
    s.exited("h1#1", 0)
    s.tick()
    assert s.spawned("h1") == ["h1#0", "h1#1"]  # its slot is not refilled


# ----- worker loss, heartbeats, fencing -----------------------------------------------------------
def test_worker_killed_by_a_signal_is_lost_and_the_others_go_on() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.exited("h1#1", -9)
    assert s.state("h1#1") == WorkerState.DEAD and s.machine.pending == Cause.WORKER_FAILURE
    s.join("h1#0", step=2)
    generation = s.machine.generation
    assert generation is not None and generation.world_size == 1
    # below --max-np with its agent there: the lost slot is taken back (one restart of the budget)
    assert s.spawned("h1") == ["h1#0", "h1#1", "h1#1.1"]
    (exit_record,) = s.records(EventKind.WORKER_EXIT)
    assert exit_record["returncode"] == -9


def test_native_worker_exiting_non_zero_fails_the_job() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.exited("h1#1", 3)
    outcome = s.machine.outcome
    assert outcome is not None and not outcome.success and "exited with code 3" in outcome.message
    assert outcome.worker_id == "h1#1"
    s.join("h1#0")
    assert s.join_reply("h1#0") == JoinReply(JoinOutcome.JOB_OVER, outcome.message)


def test_user_error_fails_the_job_with_the_traceback() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=1, initial_np=1)
    s.agent("h1")
    s.running("h1#0")
    out = s.send("w:h1#0", s.who("h1#0"), UserError(id=99, traceback="Traceback: boom\n"))
    assert Reply("w:h1#0", 99, Ok()) in out
    outcome = s.machine.outcome
    assert outcome is not None and outcome.message == "worker h1#0 raised an exception\nTraceback: boom"
    (end,) = s.records(EventKind.END)
    assert end["success"] is False


def test_missed_heartbeats_fence_the_member_and_it_rejoins_as_a_newcomer() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2, heartbeat_timeout_s=10.0)
    s.agent("h1")
    s.running("h1#0", "h1#1", step=-1)
    s.clock.advance(6.0)
    s.send("w:h1#0", s.who("h1#0"), Heartbeat())
    s.tick(5.0)  # h1#1 silent for 11 s, h1#0 for 5 s
    assert s.state("h1#1") == WorkerState.DEAD and s.state("h1#0") == WorkerState.ACTIVE
    assert s.sent("w:h1#1", FencedPush) == [FencedPush("missed heartbeats", 1)]
    assert s.machine.pending == Cause.HEARTBEAT_LOSS
    assert s.sent("w:h1#0", PendingPush) == [PendingPush(1, Cause.HEARTBEAT_LOSS)]
    s.join("h1#1", step=50)  # back on the same connection, claiming a step it cannot prove
    assert s.state("h1#1") == WorkerState.WAITING and s.machine.workers["h1#1"].committed_step == -1
    s.join("h1#0", step=10)
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0", "h1#1"]
    assert generation.src_rank == 0 and generation.cause == Cause.HEARTBEAT_LOSS


def test_a_stale_connection_closing_does_not_touch_the_new_one() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=1, initial_np=1)
    s.agent("h1")
    s.running("h1#0")
    s.apply(Closed("w:old", s.who("h1#0")))
    assert s.state("h1#0") == WorkerState.ACTIVE and s.machine.pending is None


def test_agent_disconnect_kills_its_starting_workers() -> None:
    s = Script({"h1": 2}, min_np=2, max_np=2, initial_np=2)
    s.agent("h1")
    s.apply(Closed(agent_peer("h1"), Identity(Role.AGENT, "h1")))
    assert s.state("h1#0") == WorkerState.DEAD and "h1" not in s.machine.agents


def test_an_old_agent_closing_after_its_host_came_back_leaves_the_new_agents_workers_alone() -> None:
    s = Script({"h1": 1, "h2": 1}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.agent("h2")
    s.running("h1#0", "h2#0")
    s.apply(HostsChanged({"h1": 1}))  # h2 removed: its worker leaves, its agent is stopping (slowly)
    s.join("h1#0", step=5)
    s.join("h2#0", step=5)
    assert [m.worker_id for m in s.machine.generation.members] == ["h1#0"]
    s.exited("h2#0", 0)  # it left: its agent is told to exit and forgotten
    assert "h2" not in s.machine.agents
    # h2 back before the old agent's connection closed: a new agent there starts a worker
    assert StartAgent("h2") in s.apply(HostsChanged({"h1": 1, "h2": 1}))
    hello = Hello(id=next(_ids), role=Role.AGENT, host="h2", pid=8)
    s.send("agent:h2-new", Identity(Role.AGENT, "h2"), hello)
    starting = [w for w, r in s.machine.workers.items() if r.host == "h2" and r.state == WorkerState.STARTING]
    assert starting
    s.apply(Closed(agent_peer("h2"), Identity(Role.AGENT, "h2")))  # the old agent's connection
    assert [s.state(w) for w in starting] == [WorkerState.STARTING] * len(starting)
    assert s.machine.agents["h2"] == "agent:h2-new"


# ----- restart budget and --min-np ----------------------------------------------------------------
def test_below_min_np_respawns_within_max_restarts_then_fails_after_the_elastic_timeout() -> None:
    s = Script(
        {"h1": 2},
        min_np=2,
        max_np=2,
        initial_np=2,
        max_restarts=1,
        elastic_timeout_s=30.0,
        heartbeat_timeout_s=99,
    )
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.exited("h1#1", -9)
    assert s.spawned("h1") == ["h1#0", "h1#1", "h1#1.1"]  # refilled: one restart used
    s.join("h1#0", step=1)
    s.join("h1#1.1", step=-1)
    generation = s.machine.generation
    assert generation is not None and [m.worker_id for m in generation.members] == ["h1#0", "h1#1.1"]
    s.exited("h1#1.1", -9)
    assert s.spawned("h1") == ["h1#0", "h1#1", "h1#1.1"]  # the budget is spent
    s.join("h1#0", step=2)
    s.tick(29.0)
    assert s.machine.outcome is None
    s.tick(2.0)
    outcome = s.machine.outcome
    assert outcome is not None and not outcome.success and "fewer than --min-np 2" in outcome.message


def test_every_member_gone_fails_the_job() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=1, initial_np=1, max_restarts=0)
    s.agent("h1")
    s.running("h1#0")
    s.exited("h1#0", -9)
    outcome = s.machine.outcome
    assert outcome is not None and "every worker of the job is gone" in outcome.message


# ----- adoption after a coordinator restart -------------------------------------------------------
def _running_generation() -> Generation:
    members = (Member("h1#0", "h1", 11, 40), Member("h2#0", "h2", 12, 40))
    return Generation(3, members, Cause.SCALE_OUT, "old-store:1", 0, False)


def test_adopt_the_running_generation_when_every_member_is_back() -> None:
    s = Script(None, min_np=1, max_np=2, initial_np=2, adopt=True, adopt_grace_s=5.0, run_id="")
    s.apply(HostsChanged({"h1": 1, "h2": 1}))
    assert started(s) == []  # adopting: the old agents get time to reconnect
    s.agent("h1")
    generation = _running_generation()
    s.hello("h1#0", rejoin=Rejoin(generation, 41))
    assert s.machine.generation is None  # h2#0 not back yet, still in the grace
    s.hello("h2#0", rejoin=Rejoin(generation, 42))
    adopted = s.machine.generation
    assert adopted is not None and adopted.number == 3 and adopted.cause == Cause.COORDINATOR_RESTART
    assert adopted.store_address == "store:1"
    assert [m.committed_step for m in adopted.members] == [41, 42]
    assert s.state("h1#0") == WorkerState.ACTIVE and s.state("h2#0") == WorkerState.ACTIVE
    (record,) = s.records(EventKind.ADOPTED)
    assert record["present"] == ["h1#0", "h2#0"] and record["missing"] == []
    assert s.machine.pending is None


def test_adopt_after_the_grace_without_the_missing_member() -> None:
    s = Script({"h1": 1, "h2": 1}, min_np=1, max_np=2, initial_np=2, adopt=True, adopt_grace_s=5.0)
    s.agent("h1")
    s.hello("h1#0", rejoin=Rejoin(_running_generation(), 41))
    s.tick(4.0)
    assert s.machine.generation is None
    s.tick(2.0)
    adopted = s.machine.generation
    assert adopted is not None and adopted.number == 3
    assert s.state("h2#0") == WorkerState.DEAD
    assert s.machine.pending == Cause.COORDINATOR_RESTART
    assert s.sent("w:h1#0", PendingPush) == [PendingPush(4, Cause.COORDINATOR_RESTART)]
    assert s.records(EventKind.ADOPTED)[0]["missing"] == ["h2#0"]
    assert "h2" in started(s)  # past the grace, the host without an agent gets one


def test_workers_that_lost_their_peers_with_the_coordinator_are_adopted_into_the_next_generation() -> None:
    """The launcher's container died with a worker in it: the survivors' collective failed, they asked
    to join and reconnect to the replacement coordinator still asking. Their generation is adopted and
    the next one numbered after it, from their committed step (not a new first generation at step 0)."""
    s = Script({"h1": 1, "h2": 1}, min_np=1, max_np=2, initial_np=2, adopt=True, adopt_grace_s=5.0)
    s.agent("h1")
    s.hello("h1#0", rejoin=Rejoin(_running_generation(), 41))
    s.join("h1#0", 45)  # the join it was waiting in, sent again on the new connection
    s.tick(6.0)
    adopted = s.machine.generation
    assert adopted is not None and adopted.number == 3 and s.state("h1#0") == WorkerState.STOPPED
    s.tick(1.0)
    formed = s.machine.generation
    assert formed is not None and formed.number == 4 and formed.cause == Cause.COORDINATOR_RESTART
    assert [(m.worker_id, m.committed_step) for m in formed.members] == [("h1#0", 45)]
    record = s.records(EventKind.GENERATION)[-1]
    assert (record["generation"], record["start_step"]) == (4, 45)
    assert s.records(EventKind.ADOPTED)[0]["missing"] == ["h2#0"]


def test_a_rejoin_to_the_same_coordinator_on_a_new_connection_is_fenced() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    generation = s.running("h1#0", "h1#1")
    s.hello("h1#1", peer="w:h1#1-again", rejoin=Rejoin(generation, 9))
    assert s.state("h1#1") == WorkerState.STARTING and s.machine.pending == Cause.WORKER_FAILURE
    assert s.replies("w:h1#1-again") == [Ok()]


# ----- finishing ----------------------------------------------------------------------------------
def test_job_succeeds_once_every_member_has_finished() -> None:
    s = Script({"h1": 2}, min_np=1, max_np=2, initial_np=2)
    s.agent("h1")
    s.running("h1#0", "h1#1")
    s.exited("h1#0", 0)
    assert s.state("h1#0") == WorkerState.DONE and s.machine.finishing and s.machine.outcome is None
    s.apply(HostsChanged({"h1": 4}))  # a finishing job is not resized
    assert s.spawned("h1") == ["h1#0", "h1#1"] and s.machine.pending is None
    out = s.send("w:h1#1", s.who("h1#1"), Done(id=5))
    assert Reply("w:h1#1", 5, Ok()) in out
    outcome = s.machine.outcome
    assert outcome is not None and outcome.success and outcome.message == "training finished"
    assert Finish(outcome) in out
    assert ExitPush(success=True) in s.sent(agent_peer("h1"))


def test_a_finishing_job_that_loses_a_rank_below_min_np_fails_at_once() -> None:
    s = Script({"h1": 3}, min_np=2, max_np=3, initial_np=3)
    s.agent("h1")
    s.running("h1#0", "h1#1", "h1#2")
    s.exited("h1#0", 0)
    s.exited("h1#1", -9)
    assert s.machine.outcome is None  # h1#2 has not stopped yet
    s.join("h1#2", step=3)
    outcome = s.machine.outcome
    assert outcome is not None and not outcome.success and "cannot restart" in outcome.message


def test_a_worker_exiting_0_without_joining_is_not_respawned() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=1, initial_np=1)
    s.agent("h1")
    s.exited("h1#0", 0)
    outcome = s.machine.outcome
    assert outcome is not None and not outcome.success and "--mode restart" in outcome.message
    assert s.spawned("h1") == ["h1#0"]


# ----- the edges of the vocabulary ----------------------------------------------------------------
def test_unknown_messages_and_protocols_are_refused() -> None:
    s = Script({"h1": 1})
    out = s.send("x", Identity(), Unknown(id=1, type="bogus"))
    assert out == [Reply("x", 1, Refused("unknown message 'bogus'"))]
    out = s.send("y", Identity(Role.AGENT, "h1"), Hello(id=2, role=Role.AGENT, host="h1", protocol=99))
    assert out == [Reply("y", 2, Refused("protocol 99 (this coordinator speaks 1)"))]
    assert "h1" not in s.machine.agents


def test_an_agent_connecting_after_the_end_is_told_to_exit() -> None:
    s = Script({"h1": 1})
    s.apply(Abort("interrupted"))
    out = s.agent("h1")
    assert Send(agent_peer("h1"), ExitPush(success=False)) in out


def test_progress_reports_the_incident_once() -> None:
    s = Script({"h1": 1}, min_np=1, max_np=1, initial_np=1)
    s.agent("h1")
    s.running("h1#0")
    s.clock.advance(2.0)
    out = s.send("w:h1#0", s.who("h1#0"), Progress(generation=0, at=s.clock.time()))
    (report,) = [e for e in out if isinstance(e, ReportIncident)]
    assert report.incident["generation"] == 0 and report.incident["recover_s"] == pytest.approx(2.0)
    assert s.send("w:h1#0", s.who("h1#0"), Progress(generation=0, at=s.clock.time())) == []
