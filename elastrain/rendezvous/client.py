"""The worker's side of the rendezvous: a connection to the coordinator, heartbeats, the pending flag."""

from __future__ import annotations

import os
import threading

from elastrain.errors import RendezvousError
from elastrain.rendezvous.api import Generation, JoinOutcome, JoinResult, Rendezvous
from elastrain.rendezvous.wire import Message, RpcClient


class CoordinatorRendezvous(Rendezvous):
    """Talks to the coordinator of `elastrain run` over one TCP connection, reused for the job."""

    def __init__(
        self, address: str, token: str, worker_id: str, host: str, local_rank: int, heartbeat_s: float = 1.0
    ) -> None:
        self.worker_id = worker_id
        self._pending = False
        self.fenced = False
        self.lost = threading.Event()
        self._rpc = RpcClient(
            address,
            token,
            {
                "role": "worker",
                "worker_id": worker_id,
                "host": host,
                "local_rank": local_rank,
                "pid": os.getpid(),
            },
            on_push=self._on_push,
            on_disconnect=self.lost.set,
        )
        self._stop = threading.Event()
        self._heartbeat_s = heartbeat_s
        threading.Thread(target=self._heartbeat_loop, name="elastrain-heartbeat", daemon=True).start()

    def _on_push(self, msg: Message) -> None:
        kind = msg.get("type")
        if kind == "pending":
            self._pending = True
        elif kind == "fenced":
            self.fenced = True
            self._pending = True

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self._heartbeat_s):
            if not self._rpc.notify("heartbeat"):
                return

    def pending(self) -> bool:
        """True once the coordinator has announced the next generation (a plain attribute read)."""
        return self._pending

    def join(self, committed_step: int, **extra: int) -> JoinResult:
        """Ask for the next generation and wait for it (`extra`: e.g. a free port, the child's pid)."""
        self._pending = False
        reply = self._rpc.request("join", committed_step=committed_step, **extra)
        outcome = JoinOutcome(reply.get("outcome", "job_over"))
        if outcome != JoinOutcome.ADMITTED:
            return JoinResult(outcome, reason=str(reply.get("reason", "")))
        generation = Generation.from_wire(reply["generation"])
        if generation.rank_of(self.worker_id) < 0:
            raise RendezvousError(f"coordinator admitted {self.worker_id} to a generation without it")
        return JoinResult(outcome, generation)

    def report_first_step(self, generation: int, at: float) -> None:
        """Rank 0 completed the first step of `generation` (the coordinator's recovery time)."""
        self._rpc.notify("progress", generation=generation, at=at)

    def request_leave(self) -> None:
        """Ask to leave at the next commit (from a signal handler: never blocks)."""
        self._rpc.notify("leave")

    def report_done(self) -> None:
        """Tell the coordinator this worker's training function returned."""
        self._rpc.request("done", timeout=30)

    def report_error(self, traceback_text: str) -> None:
        """Tell the coordinator this worker failed; the job ends."""
        try:
            self._rpc.request("user_error", traceback=traceback_text, timeout=10)
        except RendezvousError:
            pass

    def close(self) -> None:
        """Stop heartbeats and close the connection."""
        self._stop.set()
        self._rpc.close()
