"""Restart mode: run an unmodified torchrun-style script, restarted on every membership change.

The script reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT and resumes from its own
checkpoints. For each slot the agent runs a `RestartSlot`: it joins generations on the script's
behalf, starts the script with that generation's environment, and stops it (SIGTERM, then SIGKILL)
when the next generation is announced. A script that fails is restarted (the others restart with
it) up to `max_restarts` times, as torchrun does; then the job fails.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable

from elastrain.rendezvous.api import Generation, JoinOutcome
from elastrain.rendezvous.client import CoordinatorRendezvous


def free_port(host: str) -> int:
    """A port that is free on `host` right now (rank 0's script will listen on it)."""
    with socket.socket() as s:
        try:
            s.bind((host, 0))
        except OSError:
            s.bind(("", 0))
        return int(s.getsockname()[1])


def generation_env(generation: Generation, worker_id: str, local_rank: int) -> dict[str, str]:
    """The torchrun-compatible environment of one rank of `generation`."""
    rank = generation.rank_of(worker_id)
    master = generation.members[0]
    me = generation.members[rank]
    local_world = sum(1 for m in generation.members if m.host == me.host)
    return {
        "RANK": str(rank),
        "WORLD_SIZE": str(generation.world_size),
        "LOCAL_RANK": str(local_rank),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank),
        "MASTER_ADDR": master.address or master.host,
        "MASTER_PORT": str(master.port),
        "TORCHELASTIC_RESTART_COUNT": str(generation.number),
        "TORCHELASTIC_RUN_ID": "elastrain",
    }


class RestartSlot(threading.Thread):
    """One worker slot in restart mode."""

    def __init__(
        self,
        rendezvous: CoordinatorRendezvous,
        host: str,
        local_rank: int,
        spawn: Callable[[dict[str, str]], subprocess.Popen[bytes]],
        max_restarts: int,
        stop_grace_s: float = 10.0,
    ) -> None:
        super().__init__(name=f"elastrain-restart-{rendezvous.worker_id}", daemon=True)
        self.rdzv = rendezvous
        self.host = host
        self.local_rank = local_rank
        self._spawn = spawn
        self.max_restarts = max_restarts
        self.stop_grace_s = stop_grace_s
        self.proc: subprocess.Popen[bytes] | None = None
        self.failures = 0
        self.exit_code: int | None = None

    def run(self) -> None:
        while True:
            result = self.rdzv.join(-1, port=free_port(self.host))
            if result.outcome != JoinOutcome.ADMITTED or result.generation is None:
                break
            env = generation_env(result.generation, self.rdzv.worker_id, self.local_rank)
            self.proc = self._spawn(env)
            code = self._wait_for_exit_or_change(self.proc)
            if code is None:
                continue  # stopped for the next generation
            if code == 0:
                self.rdzv.report_done()
                self.exit_code = 0
                break
            self.failures += 1
            if self.failures > self.max_restarts:
                self.rdzv.report_error(f"script exited with code {code} after {self.max_restarts} restarts")
                self.exit_code = code
                break
        self.rdzv.close()

    def _wait_for_exit_or_change(self, proc: subprocess.Popen[bytes]) -> int | None:
        while True:
            code = proc.poll()
            if code is not None:
                return code
            if self.rdzv.pending() or self.rdzv.coordinator_gone:
                self.stop()
                return None
            time.sleep(0.05)

    def stop(self) -> None:
        """Stop the script: SIGTERM, then SIGKILL after the grace period."""
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=self.stop_grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        except ProcessLookupError:
            pass
