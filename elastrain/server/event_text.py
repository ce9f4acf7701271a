"""An audit event as an English sentence: what the portal's event list and the CLI
(`elastrain cluster describe`, `cluster events`, `job events`) show, from the event's action and detail.

`event_sentence` is the one renderer: the API answers it as each event's ``text`` (next to the
structured ``action`` and ``detail``, which stay the contract for scripts), and the CLI calls it on
what the API answered. An action it does not know still reads as its name and ``key=value`` pairs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Detail = Mapping[str, Any]


def _n(count: object, word: str) -> str:
    """``1 container`` / ``3 containers``."""
    return f"{count} {word}" if count == 1 else f"{count} {word}s"


def _command(detail: Detail) -> str:
    return " ".join(str(w) for w in detail.get("command") or [])


def _job(detail: Detail) -> str:
    return f"job #{detail['job']}" if detail.get("job") is not None else "the job"


def _because(detail: Detail) -> str:
    return f": {detail['reason']}" if detail.get("reason") else ""


def _created(d: Detail) -> str:
    size = _n(d.get("containers"), "container")
    low, high = d.get("min_containers"), d.get("max_containers")
    elastic = f", elastic between {low} and {high}" if low is not None and low != high else ""
    gpus = f", {_n(d['gpus_per_container'], 'GPU')} each" if d.get("gpus_per_container") else ""
    priority = f", priority {d['priority']}" if d.get("priority") else ""
    return f"Created with {size} ({d.get('framework', '?')}){gpus}{elastic}{priority}."


def _rescheduled(d: Detail) -> str:
    before, after = d.get("before"), d.get("after")
    verb = "grew it" if isinstance(before, int) and isinstance(after, int) and after > before else "shrank it"
    return f"The scheduler {verb} from {before} to {_n(after, 'container')}{_because(d)}."


def _container_created(d: Detail) -> str:
    gpus = d.get("gpus") or []
    on = f" with GPU {', '.join(map(str, gpus))}" if gpus else ""
    return f"Container {d.get('container')} created at {d.get('address')}{on}."


def _hostfile(d: Detail) -> str:
    hosts = d.get("hosts") or []
    listed = f": {', '.join(map(str, hosts))}" if hosts else ""
    return f"Hostfile generation {d.get('generation')} lists {_n(len(hosts), 'host')}{listed}."


def _seconds(value: object) -> str:
    return f"{value:.3g} s" if isinstance(value, int | float) else "?"


_CAUSES = {
    "scale_out": "grew to",
    "scale_in": "shrank to",
    "worker_failure": "lost a worker and goes on with",
    "heartbeat_loss": "lost a silent worker and goes on with",
    "coordinator_restart": "re-formed after its coordinator restarted, with",
}


def _incident(d: Detail) -> str:
    job, world = _job(d).capitalize(), _n(d.get("world_size"), "worker")
    generation = f"generation {d.get('generation')}"
    if d.get("cause") == "start":
        return f"{job} started with {world} ({generation})."
    what = _CAUSES.get(str(d.get("cause")), f"changed ({d.get('cause')}) to")
    recover = d.get("recover_s")
    detect = d.get("detect_s")
    timing = "noticed at once" if detect == 0 else f"noticed in {_seconds(detect)}"
    timing += f", training again after {_seconds(recover)}" if recover is not None else ""
    lost = d.get("steps_lost") or 0
    tail = f", {_n(lost, 'step')} lost" if lost else ", no step lost"
    restarted = " (scripts restarted)" if d.get("restarted") else ""
    return f"{job} {what} {world} ({generation}){restarted}: {timing}{tail}."


def _checkpoint(d: Detail) -> str:
    size = d.get("bytes")
    mib = f", {size / 2**20:.1f} MiB" if isinstance(size, int | float) else ""
    return (
        f"{_job(d).capitalize()} saved a checkpoint at step {d.get('step')} (epoch {d.get('epoch')}, "
        f"{_n(d.get('world_size'), 'worker')}{mib}): {d.get('path')}."
    )


def _key_values(action: str, d: Detail) -> str:
    pairs = " ".join(f"{k}={v}" for k, v in d.items())
    return f"{action} {pairs}".rstrip()


_SENTENCES: dict[str, Callable[[Detail], str]] = {
    "cluster.created": _created,
    "cluster.scaled": lambda d: f"Scaled from {d.get('before')} to {_n(d.get('after'), 'container')}.",
    "cluster.exec": lambda d: f"Ran `{_command(d)}` in {d.get('container')}.",
    "cluster.delete_requested": lambda d: "Deletion requested.",
    "cluster.deleted": lambda d: "Deleted: every container stopped and removed.",
    "cluster.admitted": lambda d: (
        f"The scheduler started it with {_n(d.get('after'), 'container')}{_because(d)}."
    ),
    "cluster.rescheduled": _rescheduled,
    "cluster.idle_released": lambda d: f"Idle, so its workers were released{_because(d)}.",
    "cluster.preempted": lambda d: (
        f"Preempted: its {_n(d.get('before'), 'container')} went to better-ranked clusters{_because(d)}."
    ),
    "cluster.degraded": lambda d: f"Degraded: the others go on without it{_because(d)}.",
    "cluster.pending": lambda d: f"Pending{_because(d)}.",
    "cluster.running": lambda d: "Running: the launcher and its workers are up.",
    "container.created": _container_created,
    "container.running": lambda d: (
        f"Container {d.get('container')} is running (pid {d.get('pid')})"
        + (", adopted after a server restart." if d.get("adopted") else ".")
    ),
    "container.failed": lambda d: f"Container {d.get('container')} failed{_because(d)}.",
    "container.paused": lambda d: f"Container {d.get('container')} is paused (frozen): kept, not replaced.",
    "container.terminating": lambda d: f"Container {d.get('container')} is leaving: its workers drain first.",
    "container.removed": lambda d: f"Container {d.get('container')} removed{_because(d)}.",
    "container.orphan_stopped": lambda d: f"Stopped container {d.get('container')}, which no cluster owned.",
    "hostfile.written": _hostfile,
    "reconcile.failed": lambda d: (
        f"Could not {d.get('step')}"
        + (f" {d['container']}" if d.get("container") else "")
        + _because(d)
        + "."
    ),
    "job.submitted": lambda d: f"{_job(d).capitalize()} submitted: {_command(d)}",
    "job.attached": lambda d: f"{_job(d).capitalize()} started in a terminal: {_command(d)}",
    "job.cancelled": lambda d: f"{_job(d).capitalize()} cancelled.",
    "job.checkpoint": _checkpoint,
    "job.incident": _incident,
    "job.restarted": lambda d: (
        f"{_job(d).capitalize()} started again ({d.get('cause')} failure){_because(d)}."
    ),
    "user.created": lambda d: f"User {d.get('user')} created" + (" (admin)." if d.get("admin") else "."),
    "token.created": lambda d: f"Token {d.get('name') or d.get('token_id')} created for {d.get('user')}.",
    "user.quota_changed": lambda d: f"Quotas of {d.get('user')} changed.",
    "storage.created": lambda d: f"Storage area {d.get('storage')} created.",
    "storage.deleted": lambda d: f"Storage area {d.get('storage')} deleted.",
    "token.revoked": lambda d: f"Token {d.get('token_id')} of {d.get('user')} revoked.",
}


def event_sentence(action: str, detail: Detail) -> str:
    """The event as one English sentence (an action this version does not know: ``action k=v ...``;
    a detail it cannot read: the same)."""
    render = _SENTENCES.get(action)
    if render is None:
        shown = str(detail.get("action", action)) if action == "unknown" else action
        return _key_values(
            shown, {k: v for k, v in detail.items() if not (action == "unknown" and k == "action")}
        )
    try:
        return render(detail)
    except (KeyError, TypeError, ValueError, AttributeError):
        return _key_values(action, detail)


def event_text(event: Mapping[str, Any]) -> str:
    """The sentence of an event as the API answers it (a JSON object with ``action`` and ``detail``)."""
    detail = event.get("detail")
    return event_sentence(str(event.get("action", "")), detail if isinstance(detail, Mapping) else {})
