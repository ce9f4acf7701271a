"""The coordinator of one job: the RPC server that agents and workers talk to, and its inputs.

Inputs are events (an agent or worker connected, asked to join, left, finished, exited; the host
list changed; time passed). Each is applied under one lock, then `GenerationMachine._reconcile`
(generations.py) decides what to do next: spawn workers, announce a pending generation, form the
next generation, end the job. Agents and workers talk to it over `wire.RpcServer`, which authenticates
them within a deadline, caps connections and frames, and checks every message against `schema.py`
before a handler sees it; a peer whose message is malformed, or whose handler raises, is disconnected
and cleaned up by `_on_close` like any other.

How a worker's end is read (both modes; restart mode's side is in ``elastrain/agent/restart.py``):

* **Exit 0, or "done" (the training function returned): that worker has finished.** It is never
  restarted and its slot is never refilled. The job succeeds (`elastrain run` exits 0) once every
  member of the current generation has finished (or is gone). A worker that exits 0 because it was
  told to leave (scale-in, SIGTERM, its host removed) has left, not finished.
* **Once a rank has finished, the job is finishing: it runs to its end with the workers it has.** No
  worker is started, no standby admitted, no scale-out announced, and a host-list change resizes
  nothing (the ranks still running finish where they are). A departure that still needs a new
  generation (a worker lost or killed, one asking to leave, a member that stopped because a peer is
  gone) forms it from the ranks still running when at least ``--min-np`` remain; otherwise the job
  fails at once (no worker can come, so waiting for ``--elastic-timeout`` would change nothing).
* **A native-mode worker that exits 0 without ever joining** (its command does not use elastrain)
  has finished too, so it is not respawned; a job left with fewer than ``--min-np`` workers that can
  still join fails at once with a hint to use ``--mode restart``: a job where nobody joined never
  trained.
* **Exit non-zero:** native mode fails the job at once (the worker's traceback was forwarded); killed
  by a signal, the worker is lost: the others go on in a new generation (refilled from the lost
  slots while below ``--min-np``, ``--max-restarts`` times). In restart mode the agent's `RestartSlot`
  restarts the script itself, up to ``--max-restarts`` times, and then reports the job's failure.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from elastrain.hostfile import Hostfile
from elastrain.rendezvous.api import Cause, WorkerState
from elastrain.rendezvous.generations import GenerationMachine
from elastrain.rendezvous.records import LIVE, MEMBER, CoordinatorConfig, WorkerRecord
from elastrain.rendezvous.schema import validate
from elastrain.rendezvous.wire import Message, Peer, RpcServer

log = logging.getLogger("elastrain.coordinator")


class Coordinator(GenerationMachine):
    """The generation state machine plus the RPC server that feeds it events."""

    def __init__(
        self,
        config: CoordinatorConfig,
        token: str,
        store_address: str,
        start_agent: Callable[[str], None],
        bind_host: str = "127.0.0.1",
        port: int = 0,
    ) -> None:
        super().__init__(config, store_address, start_agent)
        self._lock = threading.RLock()
        self.server = RpcServer(
            bind_host,
            port,
            token,
            self._on_message,
            self._on_close,
            validate=validate,
            **config.connection_limits(),
        )
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
        """Take a worker out because its host or slot left the host list."""
        if worker.state in MEMBER:
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
                if worker is not None and worker.peer is peer and worker.state in LIVE:
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
            if self.outcome is not None:  # started before the job ended, connected after: nothing to run
                peer.push("exit", success=self.outcome.success)
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
            elif rejoin and worker.state in MEMBER and worker.peer is not peer:
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
        if worker is None or worker.state not in LIVE:
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
        worker.joined = True
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
        if worker is not None and worker.state in LIVE:
            self._worker_finished(worker)
        peer.reply(msg, ok=True)

    def _handle_user_error(self, peer: Peer, msg: Message) -> None:
        wid = peer.info.get("worker_id", "")
        worker = self.workers.get(wid)
        if worker is not None:
            worker.state = WorkerState.DEAD
        self._fail(wid, f"worker {wid} raised an exception", str(msg.get("traceback", "")))
        peer.reply(msg, ok=True)

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._tick()
            except Exception:  # one bad tick must not stop the timer for the rest of the job
                log.exception("coordinator tick failed")

    def _tick(self) -> None:
        """Drop members that missed their heartbeats, then reconcile."""
        with self._lock:
            now = time.monotonic()
            for worker in self.workers.values():
                if (
                    worker.state in MEMBER
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
