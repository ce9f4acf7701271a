"""Thin wrappers around Slurm's commands (``sbatch --parsable``, ``squeue --json``, ``sinfo --json``,
``scancel``) for the Slurm backend; pyslurm does not build against Debian's Slurm 22.05.

Every call runs the command with ``SLURM_CONF`` (and the rest) from the environment given to
`SlurmCommands`, so a server can talk to a private test cluster.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from elastrain.errors import ConfigError

# Job states in which the job holds (or will hold) its node and may run the container's init.
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "SUSPENDED", "REQUEUED", "RESIZING"})
# Node states / flags under which a container must leave its node (the hostfile drops it).
_BAD_NODE_STATES = frozenset({"down", "fail", "future", "drained", "draining"})
_BAD_NODE_FLAGS = frozenset({"DRAIN", "FAIL", "POWERING_DOWN", "POWER_DOWN", "MAINTENANCE", "REBOOT_ISSUED"})
_GPU_GRES = re.compile(r"(?:^|,)gpu(?::[^:,(]+)?:(\d+)")


class SlurmError(RuntimeError):
    """A Slurm command failed (the message carries its stderr)."""


@dataclass(frozen=True)
class SlurmJob:
    """One job as ``squeue --json`` shows it."""

    job_id: int
    name: str
    state: str
    node: str  # the batch host ('' while pending)
    cwd: str
    reason: str = ""

    @property
    def active(self) -> bool:
        """Pending or running (not completing, completed, cancelled, failed...)."""
        return self.state in ACTIVE_STATES


@dataclass(frozen=True)
class SlurmNode:
    """One node as ``sinfo --json`` shows it."""

    name: str
    state: str
    flags: tuple[str, ...] = ()
    reason: str = ""
    gpus: int = 0

    @property
    def usable(self) -> bool:
        """False when the node is drained, draining, down or failing: its containers must leave."""
        return self.state.lower() not in _BAD_NODE_STATES and not _BAD_NODE_FLAGS & set(self.flags)

    def describe(self) -> str:
        """``drain (test)`` -- the state for a reason line."""
        state = "+".join([self.state.lower(), *(f.lower() for f in self.flags)])
        return f"{state} ({self.reason})" if self.reason else state


def gres_gpus(gres: str) -> int:
    """``gpu:4`` / ``gpu:a100:2(S:0)`` -> the GPU count (0 when there is none)."""
    return sum(int(m.group(1)) for m in _GPU_GRES.finditer(gres or ""))


class SlurmCommands:
    """Run Slurm's client commands against the cluster ``env["SLURM_CONF"]`` (or the default)."""

    def __init__(self, env: Mapping[str, str] | None = None, timeout_s: float = 30.0) -> None:
        self.env = dict(os.environ if env is None else env)
        self.env.pop("SLURM_JOB_ID", None)  # a server started inside a job must not inherit its id
        self.timeout_s = timeout_s

    def run(self, *args: str, stdin: str | None = None, env: Mapping[str, str] | None = None) -> str:
        """Run one command; its stdout (`SlurmError` on a non-zero exit or a missing command)."""
        try:
            done = subprocess.run(
                list(args),
                input=stdin,
                env={**self.env, **(env or {})},
                capture_output=True,
                text=True,
                timeout=self.timeout_s,
                check=False,
            )
        except FileNotFoundError:
            raise ConfigError(f"{args[0]} not found: is Slurm's client (slurm-client) installed?") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"{args[0]} did not answer within {self.timeout_s:.0f}s") from None
        if done.returncode != 0:
            raise SlurmError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def submit(self, sbatch_args: list[str], script: str, env: Mapping[str, str]) -> int:
        """``sbatch --parsable ARGS SCRIPT`` with `env` exported to the job; the job id."""
        out = self.run("sbatch", "--parsable", *sbatch_args, script, env=env)
        try:
            return int(out.strip().split(";")[0])
        except ValueError:
            raise SlurmError(f"sbatch printed no job id: {out.strip()!r}") from None

    def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld still knows (``squeue --json``; ended ones until MinJobAge)."""
        data = json.loads(self.run("squeue", "--json"))
        return [
            SlurmJob(
                int(j["job_id"]),
                str(j.get("name", "")),
                str(j.get("job_state", "")),
                str(j.get("batch_host") or j.get("nodes") or ""),
                str(j.get("current_working_directory", "")),
                str(j.get("state_reason", "")),
            )
            for j in data.get("jobs", [])
        ]

    def nodes(self) -> dict[str, SlurmNode]:
        """Node name -> its state (``sinfo --json``)."""
        data = json.loads(self.run("sinfo", "--json"))
        found = {}
        for n in data.get("nodes", []):
            name = str(n.get("name", ""))
            found[name] = SlurmNode(
                name,
                str(n.get("state", "")),
                tuple(str(f) for f in n.get("state_flags", []) or []),
                str(n.get("reason", "")),
                gres_gpus(str(n.get("gres", ""))),
            )
        return found

    def cancel(self, job_ids: Iterable[int], signal: str | None = None) -> None:
        """``scancel`` the jobs (with ``--signal=SIG --full``: only signal every step, batch included)."""
        ids = [str(j) for j in sorted(set(job_ids))]
        if not ids:
            return
        args = ["scancel", "--quiet"]
        if signal:
            args += [f"--signal={signal}", "--full"]
        try:
            self.run(*args, *ids)
        except SlurmError:
            pass  # a job that ended meanwhile is not an error; the caller polls the states anyway

    def total_gpus(self) -> int:
        """GPUs (``gpu`` gres) over every node of the cluster."""
        return sum(n.gpus for n in self.nodes().values())
