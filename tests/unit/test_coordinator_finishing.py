"""The coordinator's reading of a worker's end: exit 0 is finished (never refilled), and a job whose ranks
have begun to finish neither grows nor resizes, and fails at once when too few ranks are left.

Driven in process with fake agent and worker connections (no processes, no sockets but the server's).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterator
from typing import Any

import pytest

from elastrain.hostfile import parse_host_list
from elastrain.rendezvous.api import Cause, WorkerState
from elastrain.rendezvous.coordinator import Coordinator
from elastrain.rendezvous.records import CoordinatorConfig

_ids = itertools.count(1)


class FakePeer:
    """A connection as the coordinator sees it: what it was told is kept."""

    def __init__(self, **info: Any) -> None:
        self.info = info
        self.address = "127.0.0.1"
        self.replies: list[dict[str, Any]] = []
        self.pushes: list[dict[str, Any]] = []

    def reply(self, request: dict[str, Any], **fields: Any) -> bool:
        self.replies.append({"reply_to": request.get("id"), **fields})
        return True

    def push(self, kind: str, **fields: Any) -> bool:
        self.pushes.append({"type": kind, **fields})
        return True

    def spawned(self) -> list[str]:
        return [w["worker_id"] for p in self.pushes if p["type"] == "spawn" for w in p["workers"]]


class Job:
    """One coordinator with its agents (one per host) and workers."""

    def __init__(self, hosts: str, min_np: int, max_np: int, initial_np: int, connect: bool = True) -> None:
        config = CoordinatorConfig(
            min_np=min_np,
            max_np=max_np,
            initial_np=initial_np,
            join_grace_s=600.0,  # the first generation forms once initial_np workers joined
            start_timeout_s=600.0,
            elastic_timeout_s=600.0,
            heartbeat_timeout_s=600.0,
        )
        self.started: list[str] = []  # hosts whose agent the coordinator started
        self.coordinator = Coordinator(config, "token", "127.0.0.1:1", self.started.append)
        self.agents: dict[str, FakePeer] = {}
        self.workers: dict[str, FakePeer] = {}
        self.set_hosts(hosts, connect)

    def send(self, peer: FakePeer, kind: str, **fields: Any) -> None:
        self.coordinator._on_message(peer, {"type": kind, "id": next(_ids), **fields})  # type: ignore[arg-type]

    def set_hosts(self, hosts: str, connect: bool = True) -> None:
        self.coordinator.set_hosts(parse_host_list(hosts))
        for host in parse_host_list(hosts).slots_by_host():
            if connect:
                self.connect(host)

    def connect(self, host: str) -> FakePeer:
        """`host`'s agent connects."""
        if host not in self.agents:
            self.agents[host] = FakePeer(role="agent", host=host)
            self.send(self.agents[host], "hello", role="agent", host=host, pid=1)
        return self.agents[host]

    def spawned(self) -> list[str]:
        return [wid for agent in self.agents.values() for wid in agent.spawned()]

    def join(self, worker_id: str, step: int = 0) -> FakePeer:
        peer = self.workers.get(worker_id)
        if peer is None:
            host, _, rank = worker_id.partition("#")
            peer = self.workers[worker_id] = FakePeer(role="worker", worker_id=worker_id)
            self.send(peer, "hello", role="worker", worker_id=worker_id, host=host, local_rank=int(rank[:1]))
        self.send(peer, "join", committed_step=step, port=0)
        return peer

    def exited(self, worker_id: str, code: int) -> None:
        host = worker_id.partition("#")[0]
        self.send(self.agents[host], "worker_exited", worker_id=worker_id, returncode=code)

    def state(self, worker_id: str) -> WorkerState:
        return self.coordinator.workers[worker_id].state

    def running(self, *worker_ids: str) -> None:
        """Start the job: these workers join and form the first generation."""
        for wid in worker_ids:
            self.join(wid)
        generation = self.coordinator.generation
        assert generation is not None and [m.worker_id for m in generation.members] == list(worker_ids)


@pytest.fixture
def job() -> Iterator[Any]:
    made: list[Job] = []

    def make(hosts: str, min_np: int, max_np: int, initial_np: int, connect: bool = True) -> Job:
        made.append(Job(hosts, min_np, max_np, initial_np, connect))
        return made[-1]

    yield make
    for j in made:
        j.coordinator.close()


def test_worker_that_exits_0_without_joining_is_not_refilled(job: Any) -> None:
    j = job("h1:1", 1, 1, 1)
    assert j.spawned() == ["h1#0"]
    j.exited("h1#0", 0)
    outcome = j.coordinator.outcome
    assert outcome is not None and not outcome.success
    assert "h1#0 exited 0 without joining the job" in outcome.message
    assert "--mode restart" in outcome.message
    assert j.spawned() == ["h1#0"]  # never respawned


def test_one_of_several_never_joining_ends_the_job_at_once(job: Any) -> None:
    j = job("h1:2", 2, 2, 2)
    j.join("h1#1")
    j.exited("h1#0", 0)
    outcome = j.coordinator.outcome
    assert outcome is not None and not outcome.success
    assert "leaving 1 of the --min-np 2 workers needed" in outcome.message


def test_rank_that_exits_0_has_finished_and_the_job_succeeds_when_all_have(job: Any) -> None:
    j = job("h1:2", 1, 2, 2)
    j.running("h1#0", "h1#1")
    j.exited("h1#0", 0)  # its script returned without reporting done: finished all the same
    assert j.state("h1#0") == WorkerState.DONE
    assert j.coordinator.pending is None and j.coordinator.outcome is None  # not a scale-in
    j.send(j.workers["h1#1"], "done")
    outcome = j.coordinator.outcome
    assert outcome is not None and outcome.success
    assert j.spawned() == ["h1#0", "h1#1"]


def test_finishing_job_does_not_grow_or_resize(job: Any) -> None:
    j = job("h1:1,h2:1", 1, 4, 2)
    j.running("h1#0", "h2#0")
    j.send(j.workers["h1#0"], "done")
    j.set_hosts("h2:1,h3:2")  # h1 and its finished rank leave, h3 comes: nothing changes any more
    assert j.coordinator.pending is None
    assert j.spawned() == ["h1#0", "h2#0"]
    assert j.started == ["h1", "h2"] and not j.agents["h3"].spawned()
    assert not any(p["type"] == "pending" for p in j.workers["h2#0"].pushes)
    j.exited("h2#0", 0)
    outcome = j.coordinator.outcome
    assert outcome is not None and outcome.success


def test_standby_is_not_admitted_once_a_rank_finished(job: Any) -> None:
    j = job("h1:3", 1, 3, 2)
    j.running("h1#0", "h1#1")
    j.send(j.workers["h1#0"], "done")
    j.join("h1#2")  # a standby (spawned before the rank finished, or by hand): left waiting
    assert j.coordinator.pending is None
    assert j.state("h1#2") == WorkerState.WAITING
    j.send(j.workers["h1#1"], "done")
    assert j.coordinator.outcome is not None and j.coordinator.outcome.success
    assert j.workers["h1#2"].replies[-1]["outcome"] == "job_over"


def test_failure_after_a_rank_finished_fails_at_once_below_min_np(job: Any) -> None:
    j = job("h1:3", 2, 3, 3)
    j.running("h1#0", "h1#1", "h1#2")
    j.send(j.workers["h1#0"], "done")
    j.exited("h1#2", -9)  # killed: lost
    assert j.coordinator.pending == Cause.WORKER_FAILURE
    j.join("h1#1", step=5)  # the survivor stops and asks for the next generation
    outcome = j.coordinator.outcome
    assert outcome is not None and not outcome.success  # at once, not after --elastic-timeout
    assert outcome.message.startswith("rank 0 had finished (exit 0) when a worker failure needed")
    assert j.spawned() == ["h1#0", "h1#1", "h1#2"]  # the lost slot was not refilled


def test_failure_after_a_rank_finished_reforms_from_the_ranks_left(job: Any) -> None:
    j = job("h1:3", 1, 3, 3)
    j.running("h1#0", "h1#1", "h1#2")
    j.send(j.workers["h1#0"], "done")
    j.exited("h1#2", -9)
    j.join("h1#1", step=5)
    generation = j.coordinator.generation
    assert generation is not None and generation.number == 1
    assert [m.worker_id for m in generation.members] == ["h1#1"]
    assert j.workers["h1#1"].replies[-1]["outcome"] == "admitted"
    assert j.coordinator.outcome is None


def test_first_generation_waits_for_agents_not_connected_yet(job: Any) -> None:
    j = job("h1:1,h2:1", 1, 2, 2, connect=False)
    j.connect("h1")
    j.join("h1#0")  # enough for --min-np 1, but h2's agent was started: its worker is expected
    assert j.coordinator.generation is None
    j.connect("h2")
    j.join("h2#0")
    generation = j.coordinator.generation
    assert generation is not None and generation.world_size == 2


def test_agent_connecting_after_the_job_ended_is_told_to_exit(job: Any) -> None:
    j = job("h1:1,h2:1", 1, 1, 1, connect=False)
    j.connect("h1")
    j.running("h1#0")
    j.send(j.workers["h1#0"], "done")
    assert j.coordinator.outcome is not None and j.coordinator.outcome.success
    late = j.connect("h2")
    assert late.pushes[-1] == {"type": "exit", "success": True}


def test_the_shell_writes_the_records_and_sets_finished(tmp_path: Any) -> None:
    config = CoordinatorConfig(min_np=1, max_np=1, initial_np=1, events_path=tmp_path / "events.jsonl")
    config.run_id = "r1"
    coordinator = Coordinator(config, "token", "127.0.0.1:1", lambda host: None)
    try:
        coordinator.abort("interrupted")
        assert coordinator.finished.is_set()
        lines = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
        assert lines == [
            {
                "event": "end",
                "success": False,
                "message": "interrupted",
                "at": lines[0]["at"],
                "run": "r1",
                "v": 1,
            }
        ]
        assert coordinator.history == lines
    finally:
        coordinator.close()
