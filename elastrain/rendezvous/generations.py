"""The coordinator's decisions: after each event, what happens next to the job's generations.

`GenerationMachine` holds the state of one job (hosts, workers, the current and the pending
generation, the outcome) and, in `_reconcile`, decides: start agents, spawn workers into free slots,
adopt a running generation (a restarted coordinator), form the first generation, announce the next
one (scale-out), form it once its members stopped, end the job. It is pure: it reads the time from an
injected `Clock` and, instead of sending or writing, appends effects (`effects.py`) for the shell to
carry out. `machine.CoordinatorMachine` turns events into calls here; how a worker's exit is read,
and what a finished rank changes, is described in `coordinator.py`.
"""

from __future__ import annotations

import logging
from typing import Any

from elastrain.rendezvous import verdicts
from elastrain.rendezvous.adoption import adopted, missing_members, newest_generation
from elastrain.rendezvous.api import Cause, Generation, Member, WorkerState
from elastrain.rendezvous.effects import (
    Clock,
    Effect,
    Finish,
    PeerRef,
    RecordEvent,
    Reply,
    Send,
    StartAgent,
)
from elastrain.rendezvous.incidents import Incident, IncidentLog
from elastrain.rendezvous.journal import Adopted, GenerationFormed, JobEnded, JournalRecord, MemberRecord
from elastrain.rendezvous.messages import ExitPush, JoinOutcome, JoinReply, PendingPush, SpawnPush, SpawnSpec
from elastrain.rendezvous.records import LIVE, MEMBER, CoordinatorConfig, Outcome, WorkerRecord
from elastrain.rendezvous.slots import SlotBook
from elastrain.rendezvous.source import start_step, vetted_steps

log = logging.getLogger("elastrain.coordinator")


class GenerationMachine:
    """The job's state and the decisions taken on it; effects accumulate in `_out`."""

    def __init__(self, config: CoordinatorConfig, store_address: str, clock: Clock) -> None:
        self.config = config
        self.store_address = store_address
        self.clock = clock
        self._out: list[Effect] = []
        self.hosts: dict[str, int] = {}
        self.slots = SlotBook(config.max_restarts)
        self.agents: dict[str, PeerRef] = {}
        self.agent_pids: dict[str, int] = {}  # host -> the pid its connected agent announced
        self.leaving_hosts: dict[
            str, int
        ] = {}  # host -> pid of its agent, told to stop: nothing starts there
        self._agents_started: set[str] = set()
        self.workers: dict[str, WorkerRecord] = {}
        self.generation: Generation | None = None
        self.pending: Cause | None = None
        self.pending_since = 0.0
        self.outcome: Outcome | None = None
        self.finishing = False  # a rank has finished (exit 0): the job runs to its end with what it has
        self._below_min_since: float | None = None
        self._started_at = clock.monotonic()
        self.history: list[dict[str, Any]] = []  # every record written to events.jsonl, in order
        self.incidents = IncidentLog()
        self._fault_at: float | None = None

    def _emit(self, effect: Effect) -> None:
        self._out.append(effect)

    def _take_effects(self) -> list[Effect]:
        out, self._out = self._out, []
        return out

    def _reply_join(self, worker: WorkerRecord, outcome: JoinOutcome, reason: str = "", **kw: Any) -> None:
        """Answer `worker`'s held join (if any), and forget it."""
        if worker.join_request is not None and worker.peer is not None:
            self._emit(Reply(worker.peer, worker.join_request.id, JoinReply(outcome, reason, **kw)))
        worker.join_request = None

    def _mark_dead(self, worker: WorkerRecord, cause: Cause) -> None:
        was_member = worker.state in MEMBER
        worker.state = WorkerState.DEAD
        worker.join_request = None
        if cause == Cause.WORKER_FAILURE:
            self.slots.lose(worker.host)  # its process is gone: the slot is free to take back
        else:
            self.slots.release(worker.host)  # a hung worker (missed heartbeats) may still hold it
        if was_member:
            self._request_generation(cause)

    def _request_generation(self, cause: Cause) -> None:
        if self.generation is None or self.outcome is not None:
            return
        if self.pending is None:
            self.pending = cause
            self.pending_since = self.clock.time()
            log.info("generation %d pending: %s", self.generation.number + 1, cause.value)
            for member in self.generation.members:
                worker = self.workers[member.worker_id]
                # not to STOPPED members: they already asked to join, and a late push would make them
                # stop again right after being admitted (one needless generation per step, forever)
                if worker.peer is not None and worker.state in (WorkerState.ACTIVE, WorkerState.LEAVING):
                    self._emit(Send(worker.peer, PendingPush(self.generation.number + 1, cause)))
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
        # a worker that lost its peers with the coordinator (the launcher's container, and the worker in
        # it, died) asks to join at once on reconnecting: it reports its generation all the same
        candidates = (WorkerState.STARTING, WorkerState.WAITING)
        reports = [w.rejoin for w in self.workers.values() if w.rejoin and w.state in candidates]
        generation = newest_generation(reports)
        in_grace = self.clock.monotonic() - self._started_at < self.config.adopt_grace_s
        if generation is None:
            return in_grace
        present = {
            w.worker_id
            for w in self.workers.values()
            if w.rejoin and w.state in candidates and w.rejoin.generation.number == generation.number
        }
        stopped = {wid for wid in present if self.workers[wid].state == WorkerState.WAITING}
        missing = missing_members(generation, present)
        if missing and in_grace:
            return True
        committed = {wid: self.workers[wid].committed_step for wid in present}
        self.generation = adopted(generation, committed, self.store_address)
        for member in generation.members:
            worker = self.workers.get(member.worker_id)
            if worker is None:
                worker = WorkerRecord(member.worker_id, member.host, 0, last_seen=self.clock.monotonic())
                self.workers[member.worker_id] = worker
            worker.rejoin = None
            if member.worker_id not in present:
                worker.state = WorkerState.DEAD
            else:  # already waiting for the next generation: a member that stopped, with its join kept
                worker.state = WorkerState.STOPPED if member.worker_id in stopped else WorkerState.ACTIVE
        now = self.clock.time()
        self.incidents.add(
            Incident(
                generation.number,
                Cause.COORDINATOR_RESTART,
                len(present),
                now - (self.clock.monotonic() - self._started_at),
                now,
                now,
                max(committed.values(), default=0),
                0,
            )
        )
        self._record(Adopted(generation.number, sorted(present), missing, self.clock.time()))
        log.warning(
            "adopted generation %d (%d workers back, %d missing)",
            generation.number,
            len(present),
            len(missing),
        )
        if missing or stopped:
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
            if host not in self._agents_started and not self.finishing:  # finishing: nothing to run there
                self._agents_started.add(host)
                self._emit(StartAgent(host))
        for host in [h for h in self.agents if h not in self.hosts]:
            if not any(w.host == host and w.state in LIVE for w in self.workers.values()):
                # its host left and its workers are gone
                self._emit(Send(self.agents.pop(host), ExitPush(success=True)))
                self._agents_started.discard(host)

    def _live(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.state in LIVE and w.state != WorkerState.LEAVING]

    def _adopting(self) -> bool:
        """A restarted coordinator still waiting for the running workers to reconnect."""
        return (
            self.config.adopt
            and self.generation is None
            and self.clock.monotonic() - self._started_at < self.config.adopt_grace_s
        )

    def _spawn_into_free_slots(self) -> None:
        if self.finishing:
            return  # no worker is started once a rank has finished
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
        if self.generation is not None:
            self.slots.refill_lost(budget, [h for h in self.hosts if h in self.agents])
        for host, agent in self.agents.items():
            if host in self.leaving_hosts:
                continue
            used = [
                w.local_rank
                for w in self.workers.values()
                if w.host == host and (w.state in LIVE or w.state == WorkerState.DONE)
            ]
            new_ids = []
            now = self.clock.monotonic()
            for wid, local_rank in self.slots.free_slots(host, self.hosts.get(host, 0), used, budget):
                self.workers[wid] = WorkerRecord(wid, host, local_rank, last_seen=now, since=now)
                new_ids.append(SpawnSpec(wid, local_rank))
                budget -= 1
            if new_ids:
                self._emit(Send(agent, SpawnPush(tuple(new_ids))))

    def _waiting(self) -> list[WorkerRecord]:
        ready = [w for w in self.workers.values() if w.state == WorkerState.WAITING and w.join_request]
        return sorted(ready, key=lambda w: w.since)

    def _starting(self) -> list[WorkerRecord]:
        return [w for w in self.workers.values() if w.state == WorkerState.STARTING]

    def _maybe_form_first(self) -> None:
        if self.finishing and len(self._waiting()) + len(self._starting()) < self.config.min_np:
            done = [w for w in self.workers.values() if w.state == WorkerState.DONE]
            live = len(self._waiting()) + len(self._starting())
            self._fail("", verdicts.cannot_start(done, live, self.config.min_np))
            return
        waiting = self._waiting()
        enough = len(waiting) >= min(self.config.initial_np, self.config.max_np)
        # more may come: workers starting, or agents started that have not connected yet (their workers)
        expected = self._starting() or any(h not in self.agents for h in self._agents_started)
        settled = len(waiting) >= self.config.min_np and (
            not expected or self.clock.monotonic() - waiting[0].since > self.config.join_grace_s
        )
        timed_out = self.clock.monotonic() - self._started_at > self.config.start_timeout_s
        # at the start bound, --min-np ready workers start the job even within the join grace (the
        # others join later): a slow start-up is not a failure when enough workers made it
        if enough or settled or (timed_out and len(waiting) >= self.config.min_np):
            self._form(Cause.START, [], waiting[: self.config.max_np])
        elif timed_out:
            self._fail(
                "",
                f"only {len(waiting)} of the {self.config.min_np} workers needed were ready after "
                f"{self.config.start_timeout_s:.0f}s; check the hosts and the script's start-up",
            )

    def _maybe_announce_scale_out(self) -> None:
        assert self.generation is not None
        if self.pending is not None or self.finishing:
            return  # a job whose ranks have begun to finish does not grow
        waiting = self._waiting()
        if not waiting or self.generation.world_size >= self.config.max_np:
            return
        oldest_wait = self.clock.monotonic() - waiting[0].since
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
        joiners = [] if self.finishing else self._waiting()[: max(0, self.config.max_np - len(stay))]
        if len(stay) + len(joiners) < self.config.min_np:
            if self.finishing:  # no worker can come: waiting for --elastic-timeout would change nothing
                self._fail("", verdicts.cannot_restart(members, self.pending, self.config.min_np))
                return
            now = self.clock.monotonic()
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
                self._reply_join(w, JoinOutcome.LEAVE, "scale-in")
                w.state = WorkerState.LEFT
        self._form(self.pending, stay, joiners)

    def _form(self, cause: Cause, stay: list[WorkerRecord], joiners: list[WorkerRecord]) -> None:
        number = 0 if self.generation is None else self.generation.number + 1
        chosen = stay + joiners
        # the source is chosen on claims the coordinator cross-checked, never on a claim alone
        steps = vetted_steps(
            [(w.worker_id, w.committed_step) for w in stay],
            [(w.worker_id, w.committed_step) for w in joiners],
            start_step(self.generation),
        )
        best = max(steps)
        src = steps.index(best)
        sync = bool(joiners) or any(s != best for s in steps) or number == 0
        generation = Generation(
            number=number,
            members=tuple(
                Member(w.worker_id, w.host, w.pid, step, w.port, w.address)
                for w, step in zip(chosen, steps, strict=True)
            ),
            cause=cause,
            store_address=self.store_address,
            src_rank=src,
            sync_state=sync,
        )
        requested = self.pending_since if self.pending is not None else self.clock.time()
        self.generation = generation
        self.pending = None
        for w in chosen:
            w.state = WorkerState.ACTIVE
            self._reply_join(w, JoinOutcome.ADMITTED, generation=generation)
        previous_max = max(steps[: len(stay)], default=best)
        self.incidents.add(
            Incident(
                number,
                cause,
                len(chosen),
                self._fault_at or requested,
                requested,
                self.clock.time(),
                best,
                max(0, previous_max - best),
            )
        )
        self._fault_at = None
        self._record(
            GenerationFormed(
                number,
                cause.value,
                len(chosen),
                [MemberRecord(w.worker_id, w.host, w.pid) for w in chosen],
                best,
                requested,
                self.clock.time(),
            )
        )
        log.info("generation %d formed: %d workers (%s)", number, len(chosen), cause.value)

    # ----- finished ranks -----------------------------------------------------------------------
    def _worker_finished(self, worker: WorkerRecord) -> None:
        """`worker` exited 0 (or its training function returned): it is done, its slot never refilled.
        The job succeeds once every member of the current generation is done (or gone)."""
        worker.state = WorkerState.DONE
        worker.join_request = None
        self.finishing = True
        if self.outcome is None and self.generation is not None:
            members = [self.workers[m.worker_id] for m in self.generation.members]
            if all(w.state in (WorkerState.DONE, WorkerState.DEAD, WorkerState.LEFT) for w in members):
                self._finish(Outcome(True, "training finished"))

    # ----- ending -------------------------------------------------------------------------------
    def _record(self, record: JournalRecord) -> None:
        data = record.to_dict(self.config.run_id)
        self.history.append(data)
        self._emit(RecordEvent(data))

    def _fail(self, worker_id: str, message: str, detail: str = "") -> None:
        if self.outcome is None:
            self._finish(Outcome(False, message + (f"\n{detail.rstrip()}" if detail else ""), worker_id))

    def _finish(self, outcome: Outcome) -> None:
        self.outcome = outcome
        self._record(JobEnded(outcome.success, outcome.message, self.clock.time()))
        for worker in self.workers.values():
            if worker.join_request is not None and worker.peer is not None:
                self._reply_join(worker, JoinOutcome.JOB_OVER, outcome.message)
        for agent in self.agents.values():
            self._emit(Send(agent, ExitPush(success=outcome.success)))
        self._emit(Finish(outcome))
