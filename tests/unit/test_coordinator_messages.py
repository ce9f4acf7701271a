"""The coordinator's wire vocabulary and records: typed, versioned, and byte-compatible with the strings.

The enums are str-valued, so the frames and events.jsonl lines they produce are the ones the agents,
workers, report, chaos harness and bench have always read.
"""

from __future__ import annotations

import json

from elastrain.rendezvous.api import Cause, Generation, JoinOutcome, Member
from elastrain.rendezvous.journal import JOURNAL_VERSION, EventKind, GenerationFormed, JobEnded, MemberRecord
from elastrain.rendezvous.messages import (
    PROTOCOL_VERSION,
    ExitPush,
    FencedPush,
    Hello,
    Join,
    JoinReply,
    Kind,
    Ok,
    PendingPush,
    Progress,
    Refused,
    Rejoin,
    SpawnPush,
    SpawnSpec,
    StopPush,
    Unknown,
    WorkerExited,
    parse,
)
from elastrain.rendezvous.schema import validate

GEN = Generation(2, (Member("h1#0", "h1", 10, 5, 29500, "10.0.0.1"),), Cause.SCALE_IN, "h0:1", 0, True)


def test_kinds_are_the_wire_strings() -> None:
    assert (
        Kind.JOIN == "join" and f"{Kind.WORKER_EXITED}" == "worker_exited" and str(Kind.PENDING) == "pending"
    )
    assert json.dumps({"type": Kind.HEARTBEAT}) == '{"type": "heartbeat"}'
    assert JoinOutcome("job_over") is JoinOutcome.JOB_OVER and f"{JoinOutcome.LEAVE}" == "leave"
    assert EventKind.GENERATION == "generation" and PROTOCOL_VERSION == 1


def test_parse_gives_typed_requests() -> None:
    hello = {
        "type": "hello",
        "id": 1,
        "token": "t",
        "role": "worker",
        "worker_id": "h1#0",
        "host": "h1",
        "local_rank": 0,
        "pid": 3,
        "rejoin": Rejoin(GEN, 7).to_wire(),
    }
    assert validate(hello) is None
    parsed = parse(hello)
    assert isinstance(parsed, Hello) and parsed.rejoin == Rejoin(GEN, 7) and parsed.id == 1
    assert parsed.protocol == PROTOCOL_VERSION
    assert parse({"type": "join", "id": 4, "committed_step": 9, "port": 1}) == Join(
        id=4, committed_step=9, port=1
    )
    assert parse({"type": "progress", "generation": 2, "at": 5}) == Progress(generation=2, at=5.0)
    exited = parse({"type": "worker_exited", "worker_id": "w", "returncode": -9, "tail": "x"})
    assert exited == WorkerExited(worker_id="w", returncode=-9, tail="x")
    assert parse({"type": "pending", "id": 2}) == Unknown(id=2, type="pending")  # a push, not a request
    assert (
        parse({"type": "hello", "role": "worker", "worker_id": "w", "host": "h", "rejoin": {}}).rejoin is None
    )


def test_hello_with_a_bad_protocol_field_is_malformed() -> None:
    base = {"type": "hello", "token": "t", "role": "agent", "host": "h1"}
    assert validate({**base, "protocol": 1}) is None
    assert validate({**base, "protocol": "1"}) == "bad field 'protocol'"


def test_replies_and_pushes_encode_as_before() -> None:
    assert Ok().to_wire() == {"ok": True}
    assert Refused("no").to_wire() == {"ok": False, "error": "no"}
    admitted = JoinReply(JoinOutcome.ADMITTED, generation=GEN).to_wire()
    assert admitted == {"outcome": "admitted", "generation": GEN.to_wire()}
    assert JoinReply(JoinOutcome.LEAVE, "scale-in").to_wire() == {"outcome": "leave", "reason": "scale-in"}
    assert PendingPush(3, Cause.SCALE_OUT).to_wire() == {
        "type": "pending",
        "generation": 3,
        "cause": "scale_out",
    }
    assert FencedPush("missed heartbeats", 4).to_wire() == {
        "type": "fenced",
        "reason": "missed heartbeats",
        "generation": 4,
    }
    spawn = SpawnPush((SpawnSpec("h1#0", 0), SpawnSpec("h1#1", 1)))
    assert spawn.to_wire() == {
        "type": "spawn",
        "workers": [{"worker_id": "h1#0", "local_rank": 0}, {"worker_id": "h1#1", "local_rank": 1}],
    }
    assert SpawnPush.from_wire(json.loads(json.dumps(spawn.to_wire()))) == spawn
    assert StopPush(("h1#0",)).to_wire() == {"type": "stop", "worker_ids": ["h1#0"]}
    assert ExitPush(success=False).to_wire() == {"type": "exit", "success": False}


def test_journal_records_keep_their_keys() -> None:
    formed = GenerationFormed(1, "scale_out", 1, [MemberRecord("h1#0", "h1", 10)], 5, 1.0, 2.0).to_dict("r")
    assert list(formed) == [
        "event",
        "generation",
        "cause",
        "world_size",
        "members",
        "start_step",
        "requested_at",
        "formed_at",
        "run",
        "v",
    ]
    assert formed["event"] == "generation" and formed["members"] == [
        {"worker_id": "h1#0", "host": "h1", "pid": 10}
    ]
    assert formed["v"] == JOURNAL_VERSION
    ended = json.loads(json.dumps(JobEnded(True, "training finished", 3.0).to_dict("r")))
    assert ended == {
        "event": "end",
        "success": True,
        "message": "training finished",
        "at": 3.0,
        "run": "r",
        "v": 1,
    }
