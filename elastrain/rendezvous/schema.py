"""The shape of every message an agent or worker sends the coordinator, checked before it is handled.

`validate(msg)` returns None when `msg` is well formed, else a short reason. Unknown message types
pass (the coordinator answers them "unknown message"); unknown extra fields are ignored (a newer peer
may send more). Known fields must have the right type and a sane range: an authenticated peer that
sends anything else is answered with the reason and disconnected, and cleaned up as on any close.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from elastrain.rendezvous.api import Cause
from elastrain.rendezvous.messages import Kind, Role

Check = Callable[[Any], bool]

_INT_MAX = (1 << 63) - 1
_MAX_NAME = 1024  # worker ids, host names, addresses
_MAX_TEXT = 16 * 1024 * 1024  # tracebacks and output tails (the frame cap bounds them first)


def _int(lo: int = -_INT_MAX, hi: int = _INT_MAX) -> Check:
    return lambda v: isinstance(v, int) and not isinstance(v, bool) and lo <= v <= hi


def _str(lo: int = 0, hi: int = _MAX_NAME) -> Check:
    return lambda v: isinstance(v, str) and lo <= len(v) <= hi


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) and abs(v) < 1e18


def _bool(v: Any) -> bool:
    return isinstance(v, bool)


_PID = _int(0, (1 << 31) - 1)
_PORT = _int(0, 65535)
_STEP = _int(-1)
_NAME = _str(1)

_MEMBER_REQUIRED: dict[str, Check] = {
    "worker_id": _NAME,
    "host": _str(),
    "pid": _PID,
    "committed_step": _STEP,
}
_MEMBER_OPTIONAL: dict[str, Check] = {"port": _PORT, "address": _str()}


def _member(v: Any) -> bool:
    if not isinstance(v, dict) or not set(v) <= set(_MEMBER_REQUIRED) | set(_MEMBER_OPTIONAL):
        return False  # `Member(**m)` must not see an unknown keyword
    if any(k not in v or not check(v[k]) for k, check in _MEMBER_REQUIRED.items()):
        return False
    return all(check(v[k]) for k, check in _MEMBER_OPTIONAL.items() if k in v)


def _generation(v: Any) -> bool:
    """A `Generation.to_wire()` dict that `Generation.from_wire` and the adoption code can use."""
    if not isinstance(v, dict):
        return False
    members = v.get("members")
    if not isinstance(members, list) or not members or not all(_member(m) for m in members):
        return False
    if len({m["worker_id"] for m in members}) != len(members):
        return False
    return (
        _int(0)(v.get("number"))
        and v.get("cause") in {c.value for c in Cause}
        and _str()(v.get("store_address"))
        and _int(0, len(members) - 1)(v.get("src_rank"))
        and _bool(v.get("sync_state"))
    )


def _rejoin(v: Any) -> bool:
    if v is None or v == {}:
        return True  # falsy: "not a rejoin"
    return isinstance(v, dict) and _generation(v.get("generation")) and _STEP(v.get("committed_step"))


# kind -> (required fields, optional fields); the hello's own fields depend on its role (below)
_KINDS: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    Kind.HEARTBEAT: ({}, {}),
    Kind.PROGRESS: ({}, {"generation": _int(-1), "at": _number}),
    Kind.WORKER_STARTED: ({"worker_id": _NAME}, {"pid": _PID}),
    Kind.WORKER_EXITED: (
        {"worker_id": _NAME},
        {"returncode": _int(-(1 << 31), (1 << 31) - 1), "tail": _str(0, _MAX_TEXT)},
    ),
    Kind.JOIN: ({}, {"committed_step": _STEP, "port": _PORT, "pid": _PID}),
    Kind.LEAVE: ({}, {}),
    Kind.DONE: ({}, {}),
    Kind.USER_ERROR: ({}, {"traceback": _str(0, _MAX_TEXT)}),
}
_HELLO: dict[str, tuple[dict[str, Check], dict[str, Check]]] = {
    Role.AGENT: ({"token": _str(0, 4096), "host": _NAME}, {"pid": _PID, "protocol": _int(0, 1 << 16)}),
    Role.WORKER: (
        {"token": _str(0, 4096), "worker_id": _NAME, "host": _NAME},
        {
            "local_rank": _int(0, 1 << 20),
            "pid": _PID,
            "run_id": _str(),
            "rejoin": _rejoin,
            "protocol": _int(0, 1 << 16),
        },
    ),
}


def _fields(msg: dict[str, Any], required: dict[str, Check], optional: dict[str, Check]) -> str | None:
    for name, check in required.items():
        if name not in msg:
            return f"missing field {name!r}"
        if not check(msg[name]):
            return f"bad field {name!r}"
    for name, check in optional.items():
        if name in msg and not check(msg[name]):
            return f"bad field {name!r}"
    return None


def validate(msg: Any) -> str | None:
    """None when `msg` is a well-formed message, else why it is not."""
    if not isinstance(msg, dict):
        return "a message is a JSON object"
    kind = msg.get("type")
    if not isinstance(kind, str) or not 0 < len(kind) <= 64:
        return "bad field 'type'"
    if "id" in msg and not _int()(msg["id"]):
        return "bad field 'id'"
    if kind == Kind.HELLO:
        role = msg.get("role")
        if role not in _HELLO:
            return (
                f"unknown role {role!r}" if isinstance(role, str) and len(role) < 64 else "bad field 'role'"
            )
        return _fields(msg, *_HELLO[role])
    if kind in _KINDS:
        return _fields(msg, *_KINDS[kind])
    return None
