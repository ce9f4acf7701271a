"""One agent per host: spawns workers when the coordinator asks, forwards their output, reports exits.

Workers are started in their own process group; on ``stop`` they get SIGTERM (a graceful leave), on
``exit`` after a failed job they are killed. The agent exits when the coordinator says the job is
over and its workers are gone, or when it loses the coordinator.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import IO

from elastrain.contracts.env import WorkerEnv
from elastrain.errors import CoordinatorLost
from elastrain.procutil import Spawner, die_with_parent, resolve_python
from elastrain.rendezvous.messages import PROTOCOL_VERSION, Kind, Role, SpawnPush
from elastrain.rendezvous.reconnect import ReconnectingClient
from elastrain.rendezvous.wire import Message

log = logging.getLogger("elastrain.agent")


@dataclass
class AgentConfig:
    """Where the coordinator is, which host this agent stands for, and what to run."""

    coordinator: str
    token: str
    host: str
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    prefix_output: bool = True
    kill_grace_s: float = 10.0
    restart_mode: bool = False
    max_restarts: int = 3
    coordinator_timeout_s: float = field(
        default_factory=lambda: float(os.environ.get(WorkerEnv.COORDINATOR_TIMEOUT, "30"))
    )


class Agent:
    """Spawns and supervises the workers of one host."""

    def __init__(self, config: AgentConfig) -> None:
        self.config = config
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.tails: dict[str, deque[str]] = {}
        self._pumps: dict[str, threading.Thread] = {}
        self.slots: dict[str, threading.Thread] = {}
        self._spawner = Spawner()
        self._lock = threading.Lock()
        self._exit_requested = threading.Event()
        self._job_success = True
        self._coordinator_gone = False
        self._ready = threading.Event()  # a push may arrive during the hello, before self.client is set
        self.client = ReconnectingClient(
            config.coordinator,
            config.token,
            lambda: {
                "role": Role.AGENT.value,
                "host": config.host,
                "pid": os.getpid(),
                "protocol": PROTOCOL_VERSION,
            },
            self._on_push,
            config.coordinator_timeout_s,
            on_give_up=self._give_up,
        )
        self._ready.set()

    def _give_up(self) -> None:
        self._coordinator_gone = True
        self._exit_requested.set()

    def _on_push(self, msg: Message) -> None:
        self._ready.wait()
        kind = msg.get("type")
        if kind == Kind.SPAWN:
            for spec in SpawnPush.from_wire(msg).workers:
                self._spawn(spec.worker_id, spec.local_rank)
        elif kind == Kind.STOP:
            for wid in msg.get("worker_ids", []):
                self._signal(wid, signal.SIGTERM)
        elif kind == Kind.EXIT:
            self._job_success = bool(msg.get("success", True))
            self._exit_requested.set()

    def _spawn(self, worker_id: str, local_rank: int) -> None:
        if self.config.restart_mode:
            self._spawn_restart_slot(worker_id, local_rank)
            return
        proc = self._start_process(worker_id, local_rank, {})
        self.client.notify(Kind.WORKER_STARTED, worker_id=worker_id, pid=proc.pid)
        threading.Thread(target=self._watch, args=(worker_id, proc), daemon=True).start()

    def _spawn_restart_slot(self, worker_id: str, local_rank: int) -> None:
        from elastrain.agent.restart import RestartSlot
        from elastrain.rendezvous.client import CoordinatorRendezvous

        rdzv = CoordinatorRendezvous(
            self.config.coordinator, self.config.token, worker_id, self.config.host, local_rank
        )
        slot = RestartSlot(
            rdzv,
            self.config.host,
            local_rank,
            lambda env: self._start_process(worker_id, local_rank, env),
            self.config.max_restarts,
            output_tail=lambda: self._output_tail(worker_id),
        )
        with self._lock:
            self.slots[worker_id] = slot
        slot.start()

    def _start_process(
        self, worker_id: str, local_rank: int, extra_env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ)
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun does: N workers must not each take every core
        env.update(self.config.env)
        env.update(
            {
                WorkerEnv.COORDINATOR: self.config.coordinator,
                WorkerEnv.JOB_TOKEN: self.config.token,
                WorkerEnv.WORKER_ID: worker_id,
                WorkerEnv.HOST: self.config.host,
                WorkerEnv.LOCAL_RANK: str(local_rank),
                "LOCAL_RANK": str(local_rank),
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.config.restart_mode:
            env.pop(WorkerEnv.COORDINATOR)  # the script is not an elastrain worker; its slot is
        env.update(extra_env)
        proc: subprocess.Popen[bytes] = self._spawner.call(  # type: ignore[assignment]
            lambda: subprocess.Popen(
                self.config.command,
                env=env,
                stdout=subprocess.PIPE if self.config.prefix_output else None,
                stderr=subprocess.STDOUT if self.config.prefix_output else None,
                start_new_session=True,
                preexec_fn=die_with_parent(),
            )
        )
        with self._lock:
            self.procs[worker_id] = proc
            self.tails[worker_id] = deque(maxlen=40)
        if proc.stdout is not None:
            pump = threading.Thread(target=self._pump, args=(worker_id, proc.stdout), daemon=True)
            self._pumps[worker_id] = pump
            pump.start()
        if self.config.restart_mode:
            threading.Thread(target=self._forget_when_done, args=(worker_id, proc), daemon=True).start()
        return proc

    def _output_tail(self, worker_id: str) -> list[str]:
        """The last output lines of `worker_id`'s process, once its pipe is drained (bounded wait)."""
        pump = self._pumps.get(worker_id)
        if pump is not None:
            pump.join(timeout=2.0)
        return list(self.tails.get(worker_id, ()))

    def _forget_when_done(self, worker_id: str, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        with self._lock:
            if self.procs.get(worker_id) is proc:
                self.procs.pop(worker_id, None)

    def _pump(self, worker_id: str, stream: IO[bytes]) -> None:
        tail = self.tails[worker_id]
        for raw in iter(stream.readline, b""):
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            sys.stdout.write(f"[{worker_id}] {line}\n")
            sys.stdout.flush()

    def _watch(self, worker_id: str, proc: subprocess.Popen[bytes]) -> None:
        code = proc.wait()
        time.sleep(0.05) if proc.stdout is not None else None  # let the pump print the last lines
        tail = "\n".join(self.tails.get(worker_id, ()))
        self.client.notify(Kind.WORKER_EXITED, worker_id=worker_id, returncode=code, tail=tail)
        with self._lock:
            self.procs.pop(worker_id, None)

    def _signal(self, worker_id: str, sig: signal.Signals) -> None:
        with self._lock:
            proc = self.procs.get(worker_id)
        if proc is not None and proc.poll() is None:
            try:
                os.kill(proc.pid, sig)
            except ProcessLookupError:
                pass

    def terminate_all(self, sig: signal.Signals) -> None:
        """Send `sig` to every worker still running."""
        with self._lock:
            ids = list(self.procs)
        for wid in ids:
            self._signal(wid, sig)

    def told_to_stop(self) -> None:
        """SIGTERM to the agent (its host is going away): its workers leave. The coordinator hears
        it from the agent at once, so their peers stop at the next commit even while a worker's own
        SIGTERM handler has not run yet; then every worker gets SIGTERM (a graceful leave)."""
        # from a signal handler: the send happens on a thread of its own (see `request_leave`)
        threading.Thread(target=self.client.notify, args=(Kind.LEAVE,), name="elastrain-leave").start()
        self.terminate_all(signal.SIGTERM)

    def run(self) -> int:
        """Serve until the job is over; return the agent's exit code."""
        signal.signal(signal.SIGTERM, lambda *_: self.told_to_stop())
        self._exit_requested.wait()
        if self._coordinator_gone:
            # the workers saw the same outage: rank 0 writes a checkpoint, then they exit on their own
            deadline = time.monotonic() + self.config.coordinator_timeout_s + 60.0
        elif self._job_success:
            deadline = float("inf")  # after success the workers finish on their own (evaluation, saving)
        else:
            deadline = time.monotonic() + self.config.kill_grace_s
            self.terminate_all(signal.SIGTERM)
        while self.procs and time.monotonic() < deadline:
            time.sleep(0.05)
        self.terminate_all(signal.SIGKILL)
        self.client.close()
        return 0 if self._job_success else 1


def main(argv: list[str] | None = None) -> int:
    """`elastrain agent`: join a job's coordinator as one host."""
    import argparse

    parser = argparse.ArgumentParser(prog="elastrain agent", description=main.__doc__)
    parser.add_argument("--coordinator", required=True, help="HOST:PORT printed by `elastrain run`")
    parser.add_argument("--host", required=True, help="this host's name as the hostfile lists it")
    parser.add_argument("--token", default=os.environ.get(WorkerEnv.JOB_TOKEN, ""), help="job token")
    parser.add_argument(
        "--restart-mode",
        action="store_true",
        help="the script is torchrun-style: restart it on every membership change",
    )
    parser.add_argument(
        "--max-restarts", type=int, default=3, help="restart-mode failures tolerated per slot"
    )
    parser.add_argument("command", nargs=argparse.REMAINDER, help="the training command (after --)")
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)  # nothing after -- is read as an option
    args = parser.parse_args(argv[:split])
    command = resolve_python(argv[split + 1 :] or args.command)
    if not command:
        parser.error("give the training command after --")
    logging.basicConfig(level=logging.WARNING, format="elastrain-agent: %(message)s")
    try:
        agent = Agent(
            AgentConfig(
                args.coordinator,
                args.token,
                args.host,
                command,
                restart_mode=args.restart_mode,
                max_restarts=args.max_restarts,
            )
        )
    except CoordinatorLost as exc:
        print(f"elastrain agent: {exc}", file=sys.stderr)
        return 2
    return agent.run()


if __name__ == "__main__":
    sys.exit(main())
