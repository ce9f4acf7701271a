"""The coordinator of one job: a thin I/O shell around the pure `machine.CoordinatorMachine`.

`Coordinator` owns the lock, the RPC server agents and workers talk to, the 100 ms tick thread and
the events file. Each input (a message, a closed connection, a tick, a host-list change, an abort) is
turned into an event (`effects.py`) and handed to the machine under the lock; the effects it returns
(replies, pushes, agents to start, records, an incident, the job's end) are carried out at once,
still under the lock, in order. The machine decides everything (`generations.py`: spawn workers,
announce a pending generation, form the next one, end the job) and never touches a socket, thread,
file or clock. Agents and workers talk over `wire.RpcServer`, which authenticates them within a
deadline, caps connections and frames, and checks every message against `schema.py` before it is
parsed into the typed vocabulary of `messages.py`; a peer whose message is malformed, or whose handler
raises, is disconnected and cleaned up like any other.

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

import json
import logging
import threading
from collections.abc import Callable
from typing import Any, cast

from elastrain.hostfile import Hostfile
from elastrain.rendezvous.api import Cause, Generation
from elastrain.rendezvous.effects import (
    Abort,
    Clock,
    Closed,
    Effect,
    Event,
    Finish,
    HostsChanged,
    Identity,
    Received,
    RecordEvent,
    Reply,
    ReportIncident,
    Send,
    StartAgent,
    Tick,
)
from elastrain.rendezvous.incidents import IncidentLog
from elastrain.rendezvous.machine import CoordinatorMachine
from elastrain.rendezvous.messages import parse
from elastrain.rendezvous.records import CoordinatorConfig, Outcome, WorkerRecord
from elastrain.rendezvous.schema import validate
from elastrain.rendezvous.wire import Message, Peer, RpcServer

log = logging.getLogger("elastrain.coordinator")


class Coordinator:
    """The RPC server, timer and events file of one job, feeding `CoordinatorMachine` its events."""

    def __init__(
        self,
        config: CoordinatorConfig,
        token: str,
        store_address: str,
        start_agent: Callable[[str], None],
        bind_host: str = "127.0.0.1",
        port: int = 0,
        clock: Clock | None = None,
    ) -> None:
        self.machine = CoordinatorMachine(config, store_address, clock)
        self._start_agent = start_agent
        self.finished = threading.Event()
        self.on_incident: Callable[[dict[str, Any]], None] | None = None  # a generation's first step done
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

    # ----- the machine's state, read-only for callers -------------------------------------------
    @property
    def config(self) -> CoordinatorConfig:
        """The job's sizes and time bounds (``run_id`` may be set by an adopted worker)."""
        return self.machine.config

    @property
    def outcome(self) -> Outcome | None:
        """How the job ended (None while it runs)."""
        return self.machine.outcome

    @property
    def incidents(self) -> IncidentLog:
        """One incident per generation formed."""
        return self.machine.incidents

    @property
    def generation(self) -> Generation | None:
        """The current generation."""
        return self.machine.generation

    @property
    def pending(self) -> Cause | None:
        """Why the next generation is pending (None: none is)."""
        return self.machine.pending

    @property
    def workers(self) -> dict[str, WorkerRecord]:
        """Every worker the coordinator has heard of, by id."""
        return self.machine.workers

    @property
    def agents(self) -> dict[str, Any]:
        """The connected agents, by host."""
        return self.machine.agents

    @property
    def history(self) -> list[dict[str, Any]]:
        """Every record written to events.jsonl."""
        return self.machine.history

    # ----- inputs -------------------------------------------------------------------------------
    def set_hosts(self, hostfile: Hostfile) -> None:
        """The host list changed (hostfile rewritten, discovery output changed)."""
        self._apply(HostsChanged(hostfile.slots_by_host()))

    def abort(self, message: str) -> None:
        """End the job as failed (the launcher was interrupted)."""
        self._apply(Abort(message))

    def _on_message(self, peer: Peer, msg: Message) -> None:
        self._apply(Received(peer, Identity.from_info(peer.info, peer.address), parse(msg)))

    def _on_close(self, peer: Peer) -> None:
        self._apply(Closed(peer, Identity.from_info(peer.info, peer.address)))

    def _tick_loop(self) -> None:
        while not self._stop.wait(0.1):
            try:
                self._apply(Tick())
            except Exception:  # one bad tick must not stop the timer for the rest of the job
                log.exception("coordinator tick failed")

    # ----- outputs ------------------------------------------------------------------------------
    def _apply(self, event: Event) -> None:
        with self._lock:
            for effect in self.machine.handle(event):
                self._carry_out(effect)

    def _carry_out(self, effect: Effect) -> None:
        if isinstance(effect, Reply):
            cast(Peer, effect.peer).reply({"id": effect.request_id}, **effect.body.to_wire())
        elif isinstance(effect, Send):
            cast(Peer, effect.peer).push(effect.message.kind.value, **effect.message.fields())
        elif isinstance(effect, StartAgent):
            self._start_agent(effect.host)
        elif isinstance(effect, RecordEvent):
            if self.config.events_path is not None:
                with open(self.config.events_path, "a") as f:
                    f.write(json.dumps(effect.record) + "\n")
        elif isinstance(effect, ReportIncident):
            if self.on_incident is not None:
                self.on_incident(effect.incident)
        elif isinstance(effect, Finish):
            self.finished.set()

    def close(self) -> None:
        """Stop the server and the timer."""
        self._stop.set()
        self.server.close()
