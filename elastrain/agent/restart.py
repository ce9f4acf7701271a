"""Restart mode: run an unmodified torchrun-style script, restarted on every membership change.

The script reads RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT and resumes from its own
checkpoints. For each slot the agent runs a `RestartSlot`: it joins generations on the script's
behalf, starts the script with that generation's environment, and stops it (SIGTERM, then SIGKILL)
when the next generation is announced.

How the script's exit is read (torchrun's semantics):

* **Exit 0: this rank has finished.** It is not restarted and its slot is not refilled (the
  coordinator spawns no worker once one is done). The job succeeds (`elastrain run` exits 0) when
  every rank of the current generation has exited 0: ``elastrain run -np 1 python -c "print('hi')"``
  prints ``hi`` once. Ranks still running go on undisturbed. A rank that exits 0 on its own while a
  resize is being announced has finished too; a script that elastrain itself stopped for a resize
  has not, whatever its exit code: it runs again in the next generation.
* **Exit non-zero, or killed by a signal: a failure.** The slot asks for a new generation, so every
  rank restarts (as torchrun restarts its whole worker group). Each slot tolerates `max_restarts`
  failures (``--max-restarts``); the next one ends the job: `elastrain run` exits 1 with one line
  naming the rank, its host, its exit code and the last line of its output, e.g.
  ``elastrain: job failed after 3 restarts: rank 0 on 127.0.0.2 exited 1: ZeroDivisionError: ...``.
* **A membership change is not a failure** (hosts added or removed, a worker or host lost): the
  scripts restart in the next generation without counting.
* Once a rank has finished, the job runs to its end with the ranks it has: no worker is started or
  admitted, and a host-list change resizes nothing (the coordinator's rules, see
  ``elastrain/rendezvous/coordinator.py``). A failure that then needs the ranks still running
  restarted re-forms the generation without the finished ranks when at least ``--min-np`` remain
  (torchrun would rerun the finished ones too); otherwise (a fixed size, ``-np N``) `elastrain run`
  ends the job at once, exit 1, saying so.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

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


FAILED_AFTER = "job failed after"  # how the one-line failure of a restart-mode job begins


def generation_env(
    generation: Generation, worker_id: str, local_rank: int, run_id: str = "elastrain"
) -> dict[str, str]:
    """The torchrun-compatible environment of one rank of `generation` (`run_id`: ``--rdzv-id``)."""
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
        "TORCHELASTIC_RUN_ID": run_id,
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
        output_tail: Callable[[], Sequence[str]] | None = None,
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
        self._output_tail = output_tail  # the script's last output lines (after it exited)
        self._run_id = os.environ.get("ELASTRAIN_RDZV_ID") or "elastrain"

    def run(self) -> None:
        while True:
            result = self.rdzv.join(-1, port=free_port(self.host))
            if result.outcome != JoinOutcome.ADMITTED or result.generation is None:
                break
            env = generation_env(result.generation, self.rdzv.worker_id, self.local_rank, self._run_id)
            self.proc = self._spawn(env)
            code = self._wait_for_exit_or_change(self.proc)
            if code is None:
                continue  # stopped for the next generation
            if code == 0:
                self.rdzv.report_done()  # finished: never restarted
                self.exit_code = 0
                break
            self.failures += 1
            if self.failures > self.max_restarts:
                self.rdzv.report_error(self.failure_line(int(env["RANK"]), code))
                self.exit_code = code
                break
        self.rdzv.close()

    def failure_line(self, rank: int, code: int) -> str:
        """``job failed after N restarts: rank R on HOST exited C: <its last output line>``."""
        if code < 0:
            try:
                how = f"was killed by {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited {code}"
        line = f"{FAILED_AFTER} {self.max_restarts} restarts: rank {rank} on {self.host} {how}"
        last = next(
            (x.strip() for x in reversed(self._output_tail() if self._output_tail else ()) if x.strip()), ""
        )
        return f"{line}: {last[:300]}" if last else line

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
