"""The coordinator as a pure state machine: events in, effects out.

`CoordinatorMachine.handle(event)` applies one event (a message from a peer, a closed connection, a
tick, a host-list change, an abort) to the job's state, lets `GenerationMachine._reconcile` decide
what follows, and returns the effects (`effects.py`) for the shell to carry out, in order. It never
reads a clock but the injected `Clock`, and never touches sockets, threads or files, so tests drive
it with a `FakeClock` and plain strings as peers. The rules it follows are in `coordinator.py`.
"""

from __future__ import annotations

import logging

from elastrain.rendezvous.api import Cause, WorkerState
from elastrain.rendezvous.effects import (
    Abort,
    Clock,
    Closed,
    Effect,
    Event,
    HostsChanged,
    Identity,
    PeerRef,
    Received,
    Reply,
    ReportIncident,
    Send,
    SystemClock,
    Tick,
)
from elastrain.rendezvous.generations import GenerationMachine
from elastrain.rendezvous.journal import AgentConnected, IncidentRecord, WorkerExit
from elastrain.rendezvous.messages import (
    PROTOCOL_VERSION,
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
    Progress,
    Refused,
    Request,
    Role,
    StopPush,
    Unknown,
    UserError,
    WorkerExited,
    WorkerStarted,
)
from elastrain.rendezvous.records import LIVE, MEMBER, CoordinatorConfig, WorkerRecord

log = logging.getLogger("elastrain.coordinator")


class CoordinatorMachine(GenerationMachine):
    """The coordinator's state and rules; `handle` is its only entry point."""

    def __init__(self, config: CoordinatorConfig, store_address: str, clock: Clock | None = None) -> None:
        super().__init__(config, store_address, clock or SystemClock())

    def handle(self, event: Event) -> list[Effect]:
        """Apply `event`, reconcile, and return the effects to carry out (in order)."""
        if isinstance(event, Received):
            self._on_message(event.peer, event.who, event.message)
        elif isinstance(event, Closed):
            self._on_close(event.peer, event.who)
        elif isinstance(event, Tick):
            self._tick()
        elif isinstance(event, HostsChanged):
            self._set_hosts(event.slots)
        elif isinstance(event, Abort):
            self._fail("", event.message)
        return self._take_effects()

    # ----- host list ----------------------------------------------------------------------------
    def _set_hosts(self, new: dict[str, int]) -> None:
        # listed by a newer host list while its agent is gone and nothing runs there: the host was
        # replaced under the same name (a node or container started anew), so it starts afresh
        revived = {
            h
            for h in new
            if h in self._agents_started
            and h not in self.agents
            and not any(w.host == h and w.state in LIVE for w in self.workers.values())
        }
        if new == self.hosts and not revived:
            return
        back = f" (back: {', '.join(sorted(revived))})" if revived else ""
        log.info("hosts changed: %s -> %s%s", self.hosts, new, back)
        self._agents_started -= revived
        self.slots.set_hosts({h: n for h, n in self.hosts.items() if h not in revived}, new)
        self.hosts = dict(new)
        for worker in self.workers.values():
            if self.finishing and worker.state in MEMBER:
                continue  # a finishing job is not resized: its running ranks finish where they are
            if worker.state in LIVE and worker.local_rank >= self.hosts.get(worker.host, 0):
                self._retire(worker)
        self._reconcile()

    def _retire(self, worker: WorkerRecord) -> None:
        """Take a worker out because its host or slot left the host list (or it asked to leave)."""
        if worker.state in MEMBER:
            if worker.state == WorkerState.ACTIVE or worker.state == WorkerState.STOPPED:
                worker.state = WorkerState.LEAVING
                self._request_generation(Cause.SCALE_IN)
        elif worker.state in (WorkerState.STARTING, WorkerState.WAITING):
            if worker.join_request is not None and worker.peer is not None:
                self._reply_join(worker, JoinOutcome.LEAVE, "host removed")
            worker.state = WorkerState.LEFT
            agent = self.agents.get(worker.host)
            if agent is not None:
                self._emit(Send(agent, StopPush((worker.worker_id,))))

    # ----- connections --------------------------------------------------------------------------
    def _on_message(self, peer: PeerRef, who: Identity, msg: Request) -> None:
        if isinstance(msg, Hello):
            self._hello(peer, who, msg)
        elif isinstance(msg, Heartbeat):
            worker = self.workers.get(who.worker_id)
            if worker is not None:
                worker.last_seen = self.clock.monotonic()
        elif isinstance(msg, Progress):
            self._progress(msg)
        elif isinstance(msg, WorkerStarted):
            started = self.workers.get(msg.worker_id)
            if started is not None and not started.pid:
                started.pid = msg.pid
        elif isinstance(msg, WorkerExited):
            self._worker_exited(msg)
        elif isinstance(msg, Join):
            self._join(peer, who, msg)
        elif isinstance(msg, Leave) and who.role == Role.AGENT:
            self._host_leaving(who.host)
        elif isinstance(msg, Leave):
            worker = self.workers.get(who.worker_id)
            if worker is not None:
                self._leave(worker)
        elif isinstance(msg, Done):
            done = self.workers.get(who.worker_id)
            if done is not None and done.state in LIVE:
                self._worker_finished(done)
            self._emit(Reply(peer, msg.id, Ok()))
        elif isinstance(msg, UserError):
            failed = self.workers.get(who.worker_id)
            if failed is not None:
                failed.state = WorkerState.DEAD
            self._fail(who.worker_id, f"worker {who.worker_id} raised an exception", msg.traceback)
            self._emit(Reply(peer, msg.id, Ok()))
        else:
            kind = msg.type if isinstance(msg, Unknown) else None
            self._emit(Reply(peer, msg.id, Refused(f"unknown message {kind!r}")))
            return
        self._reconcile()

    def _on_close(self, peer: PeerRef, who: Identity) -> None:
        if who.role == Role.AGENT:
            # only the host's current agent: an old one (its host removed, then added back) may close
            # after the new one started workers there, which are not its own
            if self.agents.get(who.host) == peer:
                del self.agents[who.host]
                for record in self.workers.values():
                    if record.host == who.host and record.state == WorkerState.STARTING:
                        record.state = WorkerState.DEAD
        elif who.role == Role.WORKER:
            worker = self.workers.get(who.worker_id)
            if worker is not None and worker.peer == peer and worker.state in LIVE:
                log.warning("lost worker %s (connection closed)", worker.worker_id)
                self._mark_dead(worker, Cause.WORKER_FAILURE)
        self._reconcile()

    def _hello(self, peer: PeerRef, who: Identity, msg: Hello) -> None:
        if msg.protocol != PROTOCOL_VERSION:
            self._emit(
                Reply(
                    peer,
                    msg.id,
                    Refused(f"protocol {msg.protocol} (this coordinator speaks {PROTOCOL_VERSION})"),
                )
            )
            return
        if msg.role == Role.AGENT:
            if self.leaving_hosts.get(msg.host) != msg.pid:
                self.leaving_hosts.pop(msg.host, None)  # a new agent there: the host is back
            self.agents[msg.host] = peer
            self.agent_pids[msg.host] = msg.pid
            self._record(AgentConnected(msg.host, msg.pid, self.clock.time()))
            self._emit(Reply(peer, msg.id, Ok()))
            if self.outcome is not None:  # started before the job ended, connected after: nothing to run
                self._emit(Send(peer, ExitPush(success=self.outcome.success)))
        elif msg.role == Role.WORKER:
            self._worker_hello(peer, who, msg)
        else:
            self._emit(Reply(peer, msg.id, Refused(f"unknown role {msg.role!r}")))

    def _worker_hello(self, peer: PeerRef, who: Identity, msg: Hello) -> None:
        wid = msg.worker_id
        worker = self.workers.get(wid)
        now = self.clock.monotonic()
        if worker is None:
            worker = WorkerRecord(wid, msg.host, msg.local_rank, last_seen=now, since=now)
            self.workers[wid] = worker
        rejoin = msg.rejoin
        if rejoin and self.config.adopt and self.generation is None:
            worker.rejoin = rejoin  # a worker that kept training while the coordinator was away
            worker.committed_step = rejoin.committed_step
            if msg.run_id:
                self.config.run_id = msg.run_id
        elif rejoin and worker.state in MEMBER and worker.peer != peer:
            # the same coordinator, a dropped connection coming back before its close was seen:
            # fenced like any member that lost contact; it rejoins as a newcomer
            self._mark_dead(worker, Cause.WORKER_FAILURE)
            self._newcomer(worker)
        elif rejoin and worker.state == WorkerState.DEAD:
            self._newcomer(worker)  # back after being dropped: a newcomer (fenced)
        if worker.state != WorkerState.STARTING:
            self._emit(Reply(peer, msg.id, Refused(f"worker {wid} is {worker.state.value}")))
            return
        worker.peer = peer
        worker.address = who.address
        worker.pid = msg.pid
        worker.last_seen = now
        self._emit(Reply(peer, msg.id, Ok()))

    def _newcomer(self, worker: WorkerRecord) -> None:
        """A worker declared lost is back: fenced out of its generation, it joins the next as a newcomer."""
        worker.state = WorkerState.STARTING
        worker.committed_step = -1
        self.slots.reclaim(worker.host)

    # ----- messages -----------------------------------------------------------------------------
    def _progress(self, msg: Progress) -> None:
        at = msg.at if msg.at is not None else self.clock.time()
        incident = self.incidents.first_step(msg.generation, at)
        if incident is not None:
            self._record(IncidentRecord(incident.to_dict()))
            self._emit(ReportIncident(incident.to_dict()))

    def _worker_exited(self, msg: WorkerExited) -> None:
        worker = self.workers.get(msg.worker_id)
        code = msg.returncode
        self._record(WorkerExit(msg.worker_id, code, self.clock.time()))
        if worker is None:
            return
        if worker.state == WorkerState.DEAD and code > 0 and self.outcome is None:
            # Its connection closed first (the process exited), so it was taken for lost; the agent's
            # report says why: it exited with an error (an uncaught exception), and that ends the job.
            self._fail(
                worker.worker_id, f"worker {worker.worker_id} exited with code {code} (see its output above)"
            )
            return
        if worker.state not in LIVE:
            return
        if code == 0 and worker.state == WorkerState.LEAVING:
            worker.state = WorkerState.LEFT  # told to leave: it left, it has not finished
            self._request_generation(Cause.SCALE_IN)
        elif code == 0:
            self._worker_finished(worker)  # finished, joined or not: never refilled
        elif code > 0 and self.outcome is None:
            # its output (the traceback) was already forwarded line by line: do not repeat it
            self._fail(
                worker.worker_id, f"worker {worker.worker_id} exited with code {code} (see its output above)"
            )
        else:
            self._mark_dead(worker, Cause.WORKER_FAILURE)

    def _join(self, peer: PeerRef, who: Identity, msg: Join) -> None:
        worker = self.workers.get(who.worker_id)
        if worker is None:
            self._emit(Reply(peer, msg.id, JoinReply(JoinOutcome.JOB_OVER, "unknown worker")))
            return
        worker.last_seen = self.clock.monotonic()
        worker.committed_step = msg.committed_step
        worker.port = msg.port
        if msg.pid:
            worker.pid = msg.pid
        if self.outcome is not None:
            self._emit(Reply(peer, msg.id, JoinReply(JoinOutcome.JOB_OVER, self.outcome.message)))
            return
        worker.join_request = msg
        worker.joined = True
        if worker.state == WorkerState.DEAD and worker.peer == peer:
            # Declared dead (missed heartbeats) but back: fenced out of the generation it was in; it may
            # join the next one as a newcomer, and its state is never used as the source.
            log.warning(
                "worker %s is back after being declared dead; it rejoins as a newcomer", worker.worker_id
            )
            self._newcomer(worker)
        if worker.state == WorkerState.STARTING:
            worker.state = WorkerState.WAITING
            worker.since = self.clock.monotonic()
        elif worker.state == WorkerState.ACTIVE:
            worker.state = WorkerState.STOPPED
            if self.pending is None:
                # A member that stops without an announcement saw a collective fail: a peer is gone.
                self._request_generation(Cause.WORKER_FAILURE)

    def _leave(self, worker: WorkerRecord) -> None:
        # A worker that asks to leave (SIGTERM: preemption, a scheduler) frees its slot for good.
        self.slots.release(worker.host)
        if worker.state in (WorkerState.ACTIVE, WorkerState.STOPPED):
            worker.state = WorkerState.LEAVING
            self._request_generation(Cause.SCALE_IN)
        elif worker.state in (WorkerState.STARTING, WorkerState.WAITING):
            self._retire(worker)

    def _host_leaving(self, host: str) -> None:
        """The agent of `host` was told to stop (SIGTERM: scancel, preemption, a drain): every worker
        there leaves now, on the agent's word. Its own SIGTERM handler may run late (the interpreter
        runs it only between bytecodes, not inside a long C call), and its peers must not wait for
        the heartbeat bound: the pending generation is announced at once, to the leavers too, so
        they stop at their next commit. No worker is started there until another agent connects."""
        log.info("the agent of %s was told to stop: its workers leave", host)
        self.leaving_hosts[host] = self.agent_pids.get(host, 0)
        for worker in list(self.workers.values()):
            if worker.host == host and worker.state in LIVE:
                self._leave(worker)

    # ----- time ---------------------------------------------------------------------------------
    def _tick(self) -> None:
        """Drop members that missed their heartbeats (and tell them), then reconcile."""
        now = self.clock.monotonic()
        for worker in self.workers.values():
            if (
                worker.state in MEMBER
                and worker.peer is not None
                and now - worker.last_seen > self.config.heartbeat_timeout_s
            ):
                log.warning("worker %s missed heartbeats for %.0fs", worker.worker_id, now - worker.last_seen)
                self._fault_at = self.clock.time() - (now - worker.last_seen)
                fenced_from = self.generation.number if self.generation is not None else 0
                self._mark_dead(worker, Cause.HEARTBEAT_LOSS)
                if worker.peer is not None:
                    self._emit(Send(worker.peer, FencedPush("missed heartbeats", fenced_from + 1)))
        self._reconcile()
