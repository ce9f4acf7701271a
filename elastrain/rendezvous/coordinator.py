"""The coordinator: owns generations and members of one job. Run by `elastrain run` (the launcher).

Inputs are events (an agent or worker connected, asked to join, exited; the hostfile changed; time
passed). After each event `_reconcile` decides, under one lock, what to do next: spawn workers,
announce a pending generation, form the next generation, end the job. Agents and workers talk to
it over `wire.RpcServer`.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from elastrain.hostfile import Hostfile
from elastrain.rendezvous.adoption import adopted, missing_members, newest_generation
from elastrain.rendezvous.api import Cause, Generation, Member, WorkerState
from elastrain.rendezvous.incidents import Incident, IncidentLog
from elastrain.rendezvous.slots import SlotBook
from elastrain.rendezvous.wire import Message, Peer, RpcServer

log = logging.getLogger("elastrain.coordinator")

_LIVE = (
    WorkerState.STARTING,
    WorkerState.WAITING,
    WorkerState.ACTIVE,
    WorkerState.STOPPED,
    WorkerState.LEAVING,
)
_MEMBER = (WorkerState.ACTIVE, WorkerState.STOPPED, WorkerState.LEAVING)


@dataclass
class CoordinatorConfig:
    """Sizes and time bounds of one job."""

    min_np: int
    max_np: int
    initial_np: int
    join_grace_s: float = 5.0  # wait this long for more starting workers before admitting the ready ones
    start_timeout_s: float = 120.0  # give up if min_np workers are not ready by then
    elastic_timeout_s: float = 60.0  # give up if below min_np this long
    heartbeat_timeout_s: float = 30.0
    max_restarts: int = 3  # respawns allowed to get back to min_np after failures
    events_path: Path | None = None
    adopt: bool = False  # a restarted coordinator: adopt the agents and workers that reconnect
    adopt_grace_s: float = 5.0
    run_id: str = ""


@dataclass
class WorkerRecord:
    """What the coordinator knows about one worker."""

    worker_id: str
    host: str
    local_rank: int
    state: WorkerState = WorkerState.STARTING
    pid: int = 0
    peer: Peer | None = None
    join_request: Message | None = None
    committed_step: int = -1
    port: int = 0
    address: str = ""
    rejoin: dict[str, Any] | None = None
    last_seen: float = field(default_factory=time.monotonic)
    since: float = field(default_factory=time.monotonic)


@dataclass
class Outcome:
    """How the job ended."""

    success: bool
    message: str = ""
    worker_id: str = ""


class Coordinator:
    """Generation state machine plus the RPC server that feeds it events."""

    def __init__(
        self,
        config: CoordinatorConfig,
        token: str,
        store_address: str,
        start_agent: Callable[[str], None],
        bind_host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        self.config = config
        self.store_address = store_address
        self._start_agent = start_agent
        self._lock = threading.RLock()
        self.hosts: dict[str, int] = {}
        self.slots = SlotBook(config.max_restarts)
        self.agents: dict[str, Peer] = {}
        self._agents_started: set[str] = set()
        self.workers: dict[str, WorkerRecord] = {}
        self.generation: Generation | None = None
        self.pending: Cause | None = None
        self.pending_since = 0.0
        self.outcome: Outcome | None = None
        self.finished = threading.Event()
        self._below_min_since: float | None = None
        self._started_at = time.monotonic()
        self.history: list[dict[str, Any]] = []
        self.incidents = IncidentLog()
        self.on_incident: Callable[[dict[str, Any]], None] | None = None  # a generation's first step done
        self._fault_at: float | None = None
        self.server = RpcServer(bind_host, port, token, self._on_message, self._on_close)
        self.address = self.server.address
        self._stop = threading.Event()
        threading.Thread(target=self._tick_loop, name="elastrain-coord-tick", daemon=True).start()

    # ----- inputs -------------------------------------------------------------------------------
    def set_hosts(self, hostfile: Hostfile) -> None:
        """The host list changed (hostfile rewritten, discovery output changed)."""
        with self._lock:
            new = hostfile.slots_by_host()
            # listed by a newer host list while its agent is gone and nothing runs there: the host was
            # replaced under the same name (a node or container started anew), so it starts afresh
            revived = {
                h
                for h in new
                if h in self._agents_started
                and h not in self.agents
                and not any(w.host == h and w.state in _LIVE for w in self.workers.values())
            }
            if new == self.hosts and not revived:
                return
            back = f" (back: {', '.join(sorted(revived))})" if revived else ""
            log.info("hosts changed: %s -> %s%s", self.hosts, new, back)
            self._agents_started -= revived
            self.slots.set_hosts({h: n for h, n in self.hosts.items() if h not in revived}, new)
            self.hosts = dict(new)
            for worker in self.workers.values():
                if worker.state in _LIVE and worker.local_rank >= self.hosts.get(worker.host, 0):
                    self._retire(worker)
            self._reconcile()

    def _retire(self, worker: WorkerRecord) -> None:
        """Take a worker out because its host or slot left the host list."""
        if worker.state in _MEMBER:
            if worker.state == WorkerState.ACTIVE or worker.state == WorkerState.STOPPED:
                worker.state = WorkerState.LEAVING
                self._request_generation(Cause.SCALE_IN)
        elif worker.state in (WorkerState.STARTING, WorkerState.WAITING):
            if worker.join_request is not None and worker.peer is not None:
                worker.peer.reply(worker.join_request, outcome="leave", reason="host removed")
                worker.join_request = None
            worker.state = WorkerState.LEFT
            agent = self.agents.get(worker.host)
            if agent is not None:
                agent.push("stop", worker_ids=[worker.worker_id])

    def _on_message(self, peer: Peer, msg: Message) -> None:
        kind = msg.get("type")
        with self._lock:
            handler = getattr(self, f"_handle_{kind}", None)
            if handler is None:
                peer.reply(msg, ok=False, error=f"unknown message {kind!r}")
                return
            handler(peer, msg)
            self._reconcile()

    def _on_close(self, peer: Peer) -> None:
        with self._lock:
            role = peer.info.get("role")
            if role == "agent":
                host = peer.info.get("host", "")
                if self.agents.get(host) is peer:
                    del self.agents[host]
                for record in self.workers.values():
                    if record.host == host and record.state == WorkerState.STARTING:
                        record.state = WorkerState.DEAD
            elif role == "worker":
                worker = self.workers.get(peer.info.get("worker_id", ""))
                if worker is not None and worker.peer is peer and worker.state in _LIVE:
                    log.warning("lost worker %s (connection closed)", worker.worker_id)
                    self._mark_dead(worker, Cause.WORKER_FAILURE)
            self._reconcile()

    def _handle_hello(self, peer: Peer, msg: Message) -> None:
        role = msg.get("role")
        if role == "agent":
            host = str(msg.get("host"))
            self.agents[host] = peer
            self._record({"event": "agent", "host": host, "pid": int(msg.get("pid", 0)), "at": time.time()})
            peer.reply(msg, ok=True)
        elif role == "worker":
            wid = str(msg.get("worker_id"))
            worker = self.workers.get(wid)
            if worker is None:
                worker = WorkerRecord(wid, str(msg.get("host")), int(msg.get("local_rank", 0)))
                self.workers[wid] = worker
            rejoin = msg.get("rejoin")
            if rejoin and self.config.adopt and self.generation is None:
                worker.rejoin = rejoin  # a worker that kept training while the coordinator was away
                worker.committed_step = int(rejoin.get("committed_step", -1))
                if msg.get("run_id"):
                    self.config.run_id = str(msg["run_id"])
            elif rejoin and worker.state in _MEMBER and worker.peer is not peer:
                # the same coordinator, a dropped connection coming back before its close was seen:
                # fenced like any member that lost contact; it rejoins as a newcomer
                self._mark_dead(worker, Cause.WORKER_FAILURE)
                worker.state = WorkerState.STARTING
                worker.committed_step = -1
                self.slots.reclaim(worker.host)
            elif rejoin and worker.state == WorkerState.DEAD:
                worker.state = WorkerState.STARTING  # back after being dropped: a newcomer (fenced)
                worker.committed_step = -1
                self.slots.reclaim(worker.host)
            if worker.state not in (WorkerState.STARTING,):
                peer.reply(msg, ok=False, error=f"worker {wid} is {worker.state.value}")
                return
            worker.peer = peer
            worker.address = peer.address
            worker.pid = int(msg.get("pid", 0))
            worker.last_seen = time.monotonic()
            peer.reply(msg, ok=True)
        else:
            peer.reply(msg, ok=False, error=f"unknown role {role!r}")

    def _handle_heartbeat(self, peer: Peer, msg: Message) -> None:
        worker = self.workers.get(peer.info.get("worker_id", ""))
        if worker is not None:
            worker.last_seen = time.monotonic()

    def _handle_progress(self, peer: Peer, msg: Message) -> None:
        incident = self.incidents.first_step(
            int(msg.get("generation", -1)), float(msg.get("at", time.time()))
        )
        if incident is not None:
            self._record({"event": "incident", **incident.to_dict()})
            if self.on_incident is not None:
                self.on_incident(incident.to_dict())

    def _handle_worker_started(self, peer: Peer, msg: Message) -> None:
        worker = self.workers.get(str(msg.get("worker_id")))
        if worker is not None and not worker.pid:
            worker.pid = int(msg.get("pid", 0))

    def _handle_worker_exited(self, peer: Peer, msg: Message) -> None:
        worker = self.workers.get(str(msg.get("worker_id")))
        code = int(msg.get("returncode", 0))
        self._record(
            {"event": "worker_exit", "worker_id": msg.get("worker_id"), "returncode": code, "at": time.time()}
        )
        if worker is None or worker.state not in _LIVE:
            return
        if code == 0:
            was_member = worker.state in _MEMBER
            worker.state = WorkerState.LEFT
            if was_member:
                self._request_generation(Cause.SCALE_IN)
        elif code > 0 and self.outcome is None:
            # its output (the traceback) was already forwarded line by line: do not repeat it
            self._fail(
                worker.worker_id, f"worker {worker.worker_id} exited with code {code} (see its output above)"
            )
        else:
            self._mark_dead(worker, Cause.WORKER_FAILURE)

    def _handle_join(self, peer: Peer, msg: Message) -> None:
        worker = self.workers.get(peer.info.get("worker_id", ""))
        if worker is None:
            peer.reply(msg, outcome="job_over", reason="unknown worker")
            return
        worker.last_seen = time.monotonic()
        worker.committed_step = int(msg.get("committed_step", -1))
        worker.port = int(msg.get("port", 0))
        if msg.get("pid"):
            worker.pid = int(msg["pid"])
        if self.outcome is not None:
            peer.reply(msg, outcome="job_over", reason=self.outcome.message)
            return
        worker.join_request = msg
        if worker.state == WorkerState.DEAD and worker.peer is peer:
            # Declared dead (missed heartbeats) but back: fenced out of the generation it was in; it may
            # join the next one as a newcomer, and its state is never used as the source.
            log.warning(
                "worker %s is back after being declared dead; it rejoins as a newcomer", worker.worker_id
            )
            worker.state = WorkerState.STARTING
            worker.committed_step = -1
            self.slots.reclaim(worker.host)
        if worker.state == WorkerState.STARTING:
            worker.state = WorkerState.WAITING
            worker.since = time.monotonic()
        elif worker.state == WorkerState.ACTIVE:
            worker.state = WorkerState.STOPPED
            if self.pending is None:
                # A member that stops without an announcement saw a collective fail: a peer is gone.
                self._request_generation(Cause.WORKER_FAILURE)

    def _handle_leave(self, peer: Peer, msg: Message) -> None:
        worker = self.workers.get(peer.info.get("worker_id", ""))
        if worker is None:
            return
        # A worker that asks to leave (SIGTERM: preemption, a scheduler) frees its slot for good.
        self.slots.release(worker.host)
        if worker.state in (WorkerState.ACTIVE, WorkerState.STOPPED):
            worker.state = WorkerState.LEAVING
            self._request_generation(Cause.SCALE_IN)
        elif worker.state in (WorkerState.STARTING, WorkerState.WAITING):
            self._retire(worker)

    def _handle_done(self, peer: Peer, msg: Message) -> None:
        worker = self.workers.get(peer.info.get("worker_id", ""))
        if worker is not None and worker.state in _LIVE:
            worker.state = WorkerState.DONE
            if self.outcome is None and self.generation is not None:
                members = [self.workers[m.worker_id] for m in self.generation.members]
                if all(w.state in (WorkerState.DONE, WorkerState.DEAD, WorkerState.LEFT) for w in members):
                    self._finish(Outcome(True, "training finished"))
        peer.reply(msg, ok=True)

    def _handle_user_error(self, peer: Peer, msg: Message) -> None:
        wid = peer.info.get("worker_id", "")
        worker = self.workers.get(wid)
        if worker is not None:
            worker.state = WorkerState.DEAD
        self._fail(wid, f"worker {wid} raised an exception", str(msg.get("traceback", "")))
        peer.reply(msg, ok=True)

    # ----- decisions ----------------------------------------------------------------------------
    def _mark_dead(self, worker: WorkerRecord, cause: Cause) -> None:
        was_member = worker.state in _MEMBER
        worker.state = WorkerState.DEAD
        worker.join_request = None
        self.slots.release(worker.host)
        if was_member:
            self._request_generation(cause)

    def _request_generation(self, cause: Cause) -> None:
        if self.generation is None or self.outcome is not None:
            return
        if self.pending is None:
            self.pending = cause
            self.pending_since = time.time()
            log.info("generation %d pending: %s", self.generation.number + 1, cause.value)
            for member in self.generation.members:
                worker = self.workers[member.worker_id]
                # not to STOPPED members: they already asked to join, and a late push would make them
                # stop again right after being admitted (one needless generation per step, forever)
                if worker.peer is not None and worker.state in (WorkerState.ACTIVE, WorkerState.LEAVING):
                    worker.peer.push("pending", generation=self.generation.number + 1, cause=cause.value)
        elif self.pending == Cause.SCALE_OUT and cause != Cause.SCALE_OUT:
            self.pending = cause  # report the more important reason

    def _reconcile(self) -> None:
        if self.outcome is not None:
            return
        self._start_missing_agents()
        self._spawn_into_free_slots()
        if self.generation is None:
            if self.config.adopt and self._maybe_adopt():
                return
            self._maybe_form_first()
        else:
            self._maybe_announce_scale_out()
            if self.pending is not None:
                self._maybe_form_next()

    def _maybe_adopt(self) -> bool:
        """A restarted coordinator: adopt the running generation. True while still waiting for it."""
        reports = [w.rejoin for w in self.workers.values() if w.rejoin and w.state == WorkerState.STARTING]
        generation = newest_generation(reports)
        in_grace = time.monotonic() - self._started_at < self.config.adopt_grace_s
        if generation is None:
            return in_grace
        present = {
            w.worker_id
            for w in self.workers.values()
            if w.rejoin
            and w.state == WorkerState.STARTING
            and w.rejoin["generation"]["number"] == generation.number
        }
        missing = missing_members(generation, present)
        if missing and in_grace:
            return True
        committed = {wid: self.workers[wid].committed_step for wid in present}
        self.generation = adopted(generation, committed, self.store_address)
        for member in generation.members:
            worker = self.workers.get(member.worker_id)
            if worker is None:
                worker = self.workers[member.worker_id] = WorkerRecord(member.worker_id, member.host, 0)
            worker.rejoin = None
            worker.state = WorkerState.ACTIVE if member.worker_id in present else WorkerState.DEAD
        now = time.time()
        self.incidents.add(
            Incident(
                generation.number,
                Cause.COORDINATOR_RESTART,
                len(present),
                now - (time.monotonic() - self._started_at),
                now,
                now,
                max(committed.values(), default=0),
                0,
            )
        )
        self._record(
            {
                "event": "adopted",
                "generation": generation.number,
                "present": sorted(present),
                "missing": missing,
                "at": time.time(),
            }
        )
        log.warning(
            "adopted generation %d (%d workers back, %d missing)",
            generation.number,
            len(present),
            len(missing),
        )
        if missing:
            self._request_generation(Cause.COORDINATOR_RESTART)
        return False

    def _start_missing_agents(self) -> None:
        if self._adopting():
            self._agents_started.update(self.agents)  # give the old agents time to reconnect
            return
        self._agents_started.update(self.agents)
        # a host whose agent is gone and that left the host list starts afresh when it comes back
        self._agents_started.intersection_update(set(self.hosts) | set(self.agents))
        for host in self.hosts:
            if host not in self._agents_started:
                self._agents_started.add(host)
                self._start_agent(host)
        for host in [h for h in self.agents if h not in self.hosts]:
            if not any(w.host == host and w.state in _LIVE for w in self.workers.values()):
                self.agents.pop(host).push("exit", success=True)  # its host left and its workers are gone
                self._agents_started.discard(host)

    def _live(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.state in _LIVE and w.state != WorkerState.LEAVING]

    def _adopting(self) -> bool:
        """A restarted coordinator still waiting for the running workers to reconnect."""
        return (
            self.config.adopt
            and self.generation is None
            and time.monotonic() - self._started_at < self.config.adopt_grace_s
        )

    def _spawn_into_free_slots(self) -> None:
        if any(w.state == WorkerState.DONE for w in self.workers.values()):
            return  # the job is finishing
        if self._adopting():
            return  # the slots may be held by workers that have not reconnected yet
        live = self._live()
        target = self.config.max_np if self.generation is not None else self.config.initial_np
        budget = target - len(live)
        if budget <= 0:
            self._below_min_since = None
            return
        if len(live) < self.config.min_np and self.generation is not None:
            self.slots.refill(self.config.min_np - len(live), self.hosts)
        for host, agent in self.agents.items():
            used = [
                w.local_rank
                for w in self.workers.values()
                if w.host == host and (w.state in _LIVE or w.state == WorkerState.DONE)
            ]
            new_ids = []
            for wid, local_rank in self.slots.free_slots(host, self.hosts.get(host, 0), used, budget):
                self.workers[wid] = WorkerRecord(wid, host, local_rank)
                new_ids.append({"worker_id": wid, "local_rank": local_rank})
                budget -= 1
            if new_ids:
                agent.push("spawn", workers=new_ids)

    def _waiting(self) -> list[WorkerRecord]:
        ready = [w for w in self.workers.values() if w.state == WorkerState.WAITING and w.join_request]
        return sorted(ready, key=lambda w: w.since)

    def _starting(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.state == WorkerState.STARTING]

    def _maybe_form_first(self) -> None:
        waiting = self._waiting()
        enough = len(waiting) >= min(self.config.initial_np, self.config.max_np)
        settled = len(waiting) >= self.config.min_np and (
            not self._starting() or time.monotonic() - waiting[0].since > self.config.join_grace_s
        )
        if enough or settled:
            self._form(Cause.START, [], waiting[: self.config.max_np])
        elif time.monotonic() - self._started_at > self.config.start_timeout_s:
            self._fail(
                "",
                f"only {len(waiting)} of the {self.config.min_np} workers needed were ready after "
                f"{self.config.start_timeout_s:.0f}s; check the hosts and the script's start-up",
            )

    def _maybe_announce_scale_out(self) -> None:
        assert self.generation is not None
        if self.pending is not None:
            return
        waiting = self._waiting()
        if not waiting or self.generation.world_size >= self.config.max_np:
            return
        oldest_wait = time.monotonic() - waiting[0].since
        if not self._starting() or oldest_wait > self.config.join_grace_s:
            self._request_generation(Cause.SCALE_OUT)

    def _maybe_form_next(self) -> None:
        assert self.generation is not None and self.pending is not None
        members = [self.workers[m.worker_id] for m in self.generation.members]
        if any(w.state == WorkerState.ACTIVE for w in members):
            return  # someone has not stopped yet
        if any(w.state == WorkerState.LEAVING and w.join_request is None for w in members):
            return  # a leaving member has not reached its commit yet
        stay = [w for w in members if w.state == WorkerState.STOPPED]
        if not stay:
            self._fail("", "every worker of the job is gone; nothing holds the training state")
            return
        joiners = self._waiting()[: max(0, self.config.max_np - len(stay))]
        if len(stay) + len(joiners) < self.config.min_np:
            now = time.monotonic()
            self._below_min_since = self._below_min_since or now
            if now - self._below_min_since > self.config.elastic_timeout_s:
                self._fail(
                    "",
                    f"fewer than --min-np {self.config.min_np} workers for "
                    f"{self.config.elastic_timeout_s:.0f}s; add hosts or lower --min-np",
                )
            return
        self._below_min_since = None
        for w in members:
            if w.state == WorkerState.LEAVING and w.peer is not None and w.join_request is not None:
                w.peer.reply(w.join_request, outcome="leave", reason="scale-in")
                w.join_request = None
                w.state = WorkerState.LEFT
        self._form(self.pending, stay, joiners)

    def _form(self, cause: Cause, stay: list[WorkerRecord], joiners: list[WorkerRecord]) -> None:
        number = 0 if self.generation is None else self.generation.number + 1
        chosen = stay + joiners
        steps = [w.committed_step for w in chosen]
        best = max(steps)
        src = steps.index(best)
        sync = bool(joiners) or any(s != best for s in steps) or number == 0
        generation = Generation(
            number=number,
            members=tuple(
                Member(w.worker_id, w.host, w.pid, w.committed_step, w.port, w.address) for w in chosen
            ),
            cause=cause,
            store_address=self.store_address,
            src_rank=src,
            sync_state=sync,
        )
        requested = self.pending_since if self.pending is not None else time.time()
        self.generation = generation
        self.pending = None
        wire = generation.to_wire()
        for w in chosen:
            w.state = WorkerState.ACTIVE
            if w.peer is not None and w.join_request is not None:
                w.peer.reply(w.join_request, outcome="admitted", generation=wire)
            w.join_request = None
        previous_max = max((w.committed_step for w in stay), default=best)
        self.incidents.add(
            Incident(
                number,
                cause,
                len(chosen),
                self._fault_at or requested,
                requested,
                time.time(),
                best,
                max(0, previous_max - best),
            )
        )
        self._fault_at = None
        record = {
            "event": "generation",
            "generation": number,
            "cause": cause.value,
            "world_size": len(chosen),
            "members": [{"worker_id": w.worker_id, "host": w.host, "pid": w.pid} for w in chosen],
            "start_step": best,
            "requested_at": requested,
            "formed_at": time.time(),
        }
        self._record(record)
        log.info("generation %d formed: %d workers (%s)", number, len(chosen), cause.value)

    def _record(self, record: dict[str, Any]) -> None:
        record["run"] = self.config.run_id
        self.history.append(record)
        if self.config.events_path is not None:
            with open(self.config.events_path, "a") as f:
                f.write(json.dumps(record) + "\n")

    def _fail(self, worker_id: str, message: str, detail: str = "") -> None:
        if self.outcome is None:
            self._finish(Outcome(False, message + (f"\n{detail.rstrip()}" if detail else ""), worker_id))

    def _finish(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._record(
            {"event": "end", "success": outcome.success, "message": outcome.message, "at": time.time()}
        )
        for worker in self.workers.values():
            if worker.join_request is not None and worker.peer is not None:
                worker.peer.reply(worker.join_request, outcome="job_over", reason=outcome.message)
                worker.join_request = None
        for agent in self.agents.values():
            agent.push("exit", success=outcome.success)
        self.finished.set()

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.1):
            with self._lock:
                now = time.monotonic()
                for worker in self.workers.values():
                    if (
                        worker.state in _MEMBER
                        and worker.peer is not None
                        and now - worker.last_seen > self.config.heartbeat_timeout_s
                    ):
                        log.warning(
                            "worker %s missed heartbeats for %.0fs", worker.worker_id, now - worker.last_seen
                        )
                        self._fault_at = time.time() - (now - worker.last_seen)
                        fenced_from = self.generation.number if self.generation is not None else 0
                        self._mark_dead(worker, Cause.HEARTBEAT_LOSS)
                        if worker.peer is not None:
                            worker.peer.push("fenced", reason="missed heartbeats", generation=fenced_from + 1)
                self._reconcile()

    def abort(self, message: str) -> None:
        """End the job as failed (the launcher was interrupted)."""
        with self._lock:
            self._fail("", message)

    def close(self) -> None:
        """Stop the server and the timer."""
        self._stop.set()
        self.server.close()
