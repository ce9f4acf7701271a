"""The worker's side of the rendezvous: a connection to the coordinator, heartbeats, the pending flag."""

from __future__ import annotations

import os
import sys
import threading

from elastrain.errors import RendezvousError
from elastrain.rendezvous.api import Generation, JoinOutcome, JoinResult, Rendezvous
from elastrain.rendezvous.messages import PROTOCOL_VERSION, Kind, Rejoin, Role
from elastrain.rendezvous.reconnect import ReconnectingClient
from elastrain.rendezvous.wire import Message


class CoordinatorRendezvous(Rendezvous):
    """Talks to the coordinator of `elastrain run` over one TCP connection, reused for the job.

    If the coordinator goes away, training goes on (collectives do not need it) while the connection
    is retried for `coordinator_timeout_s`; a restarted coordinator is greeted with this worker's
    current generation, rank and committed step, so it can adopt the running job. After the bound,
    `coordinator_gone` is set and the pending flag raised: the job stops at the next commit.
    """

    def __init__(
        self,
        address: str,
        token: str,
        worker_id: str,
        host: str,
        local_rank: int,
        heartbeat_s: float = 1.0,
        coordinator_timeout_s: float = 30.0,
        run_id: str = "",
    ) -> None:
        self.worker_id = worker_id
        self._pending = False
        self._pending_for = -1  # the newest generation a push announced
        self.fenced = False
        self.coordinator_gone = False
        self.current: Generation | None = None  # the generation this worker trains in (set by the runtime)
        self.committed_step = -1
        self._identity: Message = {
            "role": Role.WORKER.value,
            "worker_id": worker_id,
            "host": host,
            "local_rank": local_rank,
            "pid": os.getpid(),
            "run_id": run_id,
            "protocol": PROTOCOL_VERSION,
        }
        self._rpc = ReconnectingClient(
            address, token, self._hello, self._on_push, coordinator_timeout_s, on_give_up=self._give_up
        )
        self._stop = threading.Event()
        self._wake = threading.Event()  # set: the heartbeat thread has something to send now
        self._leave_requested = False
        self._leave_sent = False
        self._heartbeat_s = heartbeat_s
        threading.Thread(target=self._heartbeat_loop, name="elastrain-heartbeat", daemon=True).start()

    def _hello(self) -> Message:
        hello = dict(self._identity)
        if self.current is not None:
            hello["rejoin"] = Rejoin(self.current, self.committed_step).to_wire()
        return hello

    def _give_up(self) -> None:
        self.coordinator_gone = True
        self._pending = True

    @property
    def lost(self) -> bool:
        """True while the coordinator is unreachable."""
        return not self._rpc.connected

    def _on_push(self, msg: Message) -> None:
        kind = msg.get("type")
        if kind in (Kind.PENDING, Kind.FENCED):
            self._pending_for = max(self._pending_for, int(msg.get("generation", 1 << 62)))
            self.fenced = self.fenced or kind == Kind.FENCED
            self._pending = True

    def _heartbeat_loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self._heartbeat_s)
            self._wake.clear()
            if self._stop.is_set():
                return
            if self._leave_requested and not self._leave_sent:
                self._leave_sent = self._rpc.notify(Kind.LEAVE)  # not connected: again at the next beat
            self._rpc.notify(Kind.HEARTBEAT)

    def pending(self) -> bool:
        """True once the coordinator has announced the next generation (a plain attribute read)."""
        return self._pending

    def join(self, committed_step: int, **extra: int) -> JoinResult:
        """Ask for the next generation and wait for it (`extra`: e.g. a free port, the child's pid)."""
        self._pending = self.coordinator_gone
        reply = self._rpc.request(Kind.JOIN, committed_step=committed_step, **extra)
        outcome = JoinOutcome(reply.get("outcome", JoinOutcome.JOB_OVER))
        if outcome != JoinOutcome.ADMITTED:
            return JoinResult(outcome, reason=str(reply.get("reason", "")))
        generation = Generation.from_wire(reply["generation"])
        if self._pending_for <= generation.number:
            # a push that arrived while this join was in flight (e.g. after a partition healed) announced
            # this generation or an older one: it is not a reason to stop again
            self._pending = self.coordinator_gone
        if generation.rank_of(self.worker_id) < 0:
            raise RendezvousError(f"coordinator admitted {self.worker_id} to a generation without it")
        return JoinResult(outcome, generation)

    def report_first_step(self, generation: int, at: float) -> None:
        """Rank 0 completed the first step of `generation` (the coordinator's recovery time)."""
        self._rpc.notify(Kind.PROGRESS, generation=generation, at=at)

    def request_leave(self) -> None:
        """Ask to leave at the next commit. Called from a signal handler, so it only raises a flag
        for the heartbeat thread: sending here could wait forever on the connection's send lock,
        held by the very frame the handler interrupted (a join or a progress report being sent)."""
        self._leave_requested = True
        self._wake.set()

    def report_done(self) -> None:
        """Tell the coordinator this worker's training function returned."""
        self._rpc.request(Kind.DONE, timeout=30)

    def report_error(self, traceback_text: str) -> None:
        """Tell the coordinator this worker failed; the job ends."""
        try:
            self._rpc.request(Kind.USER_ERROR, traceback=traceback_text, timeout=10)
        except RendezvousError:
            print(traceback_text, file=sys.stderr)  # nobody else will show it

    def close(self) -> None:
        """Stop heartbeats and close the connection."""
        self._stop.set()
        self._wake.set()
        self._rpc.close()
