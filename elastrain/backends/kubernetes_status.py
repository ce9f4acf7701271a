"""What a pod's status (the API's raw JSON) means for its elastrain container: alive, ready, why it ended
or why it waits. Pure functions; `elastrain.backends.kubernetes` applies them to its watch cache.

* alive: the pod is Pending or Running and not being deleted;
* ready: Running with condition Ready (the node daemon started; pods have ``restartPolicy: Never``);
* ended (Succeeded, Failed, evicted, being deleted): a node failure, with the container's exit code,
  the kubelet's reason and message;
* waiting: not scheduled (the scheduler's reason, e.g. ``0/3 nodes are available: 3 Insufficient
  nvidia.com/gpu.``) or a container waiting (``ImagePullBackOff: ...``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from elastrain.backends.kubernetes_objects import LABEL_CLUSTER, LABEL_CONTAINER

Pod = Mapping[str, Any]


@dataclass(frozen=True)
class PodState:
    """A pod's state as the backend reports it."""

    cluster: str
    name: str
    alive: bool
    ready: bool
    ended_reason: str = ""  # why a pod that is no longer alive ended
    waiting_reason: str = ""  # why an alive pod is not ready yet (unscheduled, image pull, ...)
    unschedulable: bool = False  # the scheduler found no node for it


def _conditions(pod: Pod) -> dict[str, Mapping[str, Any]]:
    status = pod.get("status") or {}
    return {c.get("type", ""): c for c in status.get("conditions") or []}


def _container_states(pod: Pod) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return [c.get("state") or {} for c in status.get("containerStatuses") or []]


def identity(pod: Pod) -> tuple[str, str]:
    """(cluster, container) from the pod's labels."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    return str(labels.get(LABEL_CLUSTER, "")), str(labels.get(LABEL_CONTAINER, ""))


def ended_reason(pod: Pod) -> str:
    """Why a pod ended, in one line (exit code, the kubelet's reason and message)."""
    status = pod.get("status") or {}
    phase = status.get("phase", "Unknown")
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "the pod is being deleted outside elastrain (a node drain, an eviction, kubectl delete)"
    if status.get("reason") == "Evicted":
        return f"the pod was evicted: {status.get('message', 'no message')}"
    for state in _container_states(pod):
        done = state.get("terminated")
        if done:
            words = [f"the container exited with code {done.get('exitCode')}"]
            words += [f"({done['reason']})"] if done.get("reason") else []
            words += [f": {done['message'].strip()}"] if done.get("message") else []
            return " ".join(words)
    detail = status.get("message") or status.get("reason") or "no details"
    return f"the pod is {phase}: {detail}"


def waiting_reason(pod: Pod) -> tuple[str, bool]:
    """Why an alive pod is not ready, and whether the scheduler found no node for it."""
    scheduled = _conditions(pod).get("PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False":
        message = scheduled.get("message") or scheduled.get("reason") or "not scheduled"
        return f"not scheduled: {message}", scheduled.get("reason") == "Unschedulable"
    for state in _container_states(pod):
        waiting = state.get("waiting")
        if waiting:
            text = waiting.get("reason", "waiting")
            return (f"{text}: {waiting['message']}" if waiting.get("message") else text), False
    phase = (pod.get("status") or {}).get("phase", "Pending")
    return ("waiting for the pod's node to start it" if phase == "Pending" else f"the pod is {phase}"), False


def pod_state(pod: Pod) -> PodState:
    """The backend's view of one pod."""
    cluster, name = identity(pod)
    status = pod.get("status") or {}
    phase = status.get("phase", "Pending")
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))
    alive = phase in ("Pending", "Running") and not deleting
    if not alive:
        return PodState(cluster, name, False, False, ended_reason=ended_reason(pod))
    ready = phase == "Running" and (_conditions(pod).get("Ready") or {}).get("status") == "True"
    if ready:
        return PodState(cluster, name, True, True)
    why, unschedulable = waiting_reason(pod)
    return PodState(cluster, name, True, False, waiting_reason=why, unschedulable=unschedulable)
