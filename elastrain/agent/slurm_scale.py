"""What the launcher's Slurm runner does when a worker leaves the hostfile (scale-in, a failed container).

The node must leave Slurm without taking the jobs that also run elsewhere down with it (a node that
stops answering fails every job on it). In order:

1. `drain`: no new job goes to the node, and the ``elastrain run --slurm`` agent steps on it
   (``elastrain-agent-<node>``) get SIGTERM: their workers leave at their next commit and the elastic
   job shrinks;
2. `release`, polled: once no step of a job runs on its leaving nodes any more (or their containers
   are gone), the job is shrunk to its other nodes (``scontrol update JobId=J NodeList=...``, once
   for all of them); a job that ran on leaving nodes alone is cancelled once their containers are
   gone;
3. the runner then drops the node from slurm.conf (restarting slurmctld).

Slurm commands run with the config directory as working directory: ``scontrol update`` writes its
``slurm_job_J_resize.sh`` there, not into the tenant's home.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess

from elastrain.agent.slurm_conf import SLURM_DIR, SLURMD_PORT
from elastrain.errors import ConfigError

log = logging.getLogger("elastrain.slurm")

DRAIN_REASON = "elastrain scale-in"
AGENT_STEP_PREFIX = "elastrain-agent-"  # `elastrain.launcher.slurm.srun_command`'s step names


def run(
    *argv: str, timeout: float = 15.0, cwd: str | os.PathLike[str] = SLURM_DIR
) -> subprocess.CompletedProcess[str] | None:
    """A Slurm command (its output), or None when it could not run (missing, timed out)."""
    try:
        return subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout, check=False, cwd=cwd
        )
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("%s: %s", " ".join(argv), exc)
        return None


def _lines(*argv: str) -> list[list[str]]:
    done = run(*argv)
    if done is None or done.returncode != 0:
        return []
    return [line.split() for line in done.stdout.splitlines() if line.strip()]


def expand(nodelist: str) -> list[str]:
    """Node names of a Slurm hostlist (``w-[0-2]``)."""
    from elastrain.launcher.slurm import expand_hostlist

    try:
        return expand_hostlist(nodelist)
    except ConfigError:
        return []


def jobs() -> dict[str, tuple[str, list[str]]]:
    """Job id -> (state, its nodes) of every job that holds nodes."""
    return {f[0]: (f[1], expand(f[2])) for f in _lines("squeue", "-h", "-o", "%i %t %N") if len(f) == 3}


def steps() -> dict[str, list[tuple[str, set[str]]]]:
    """Job id -> its running steps (``J.S``) and the nodes each uses."""
    found: dict[str, list[tuple[str, set[str]]]] = {}
    for fields in _lines("squeue", "-h", "-s", "-o", "%i %N"):
        if len(fields) == 2:
            found.setdefault(fields[0].split(".")[0], []).append((fields[0], set(expand(fields[1]))))
    return found


def reachable(node: str, timeout: float = 0.5) -> bool:
    """Does the node's slurmd accept connections (its container still runs)?"""
    try:
        with socket.create_connection((node, SLURMD_PORT), timeout=timeout):
            return True
    except OSError:
        return False


def drain(node: str) -> list[str]:
    """Drain `node` and SIGTERM the elastrain agent steps on it; the steps told to leave."""
    run("scontrol", "update", f"nodename={node}", "state=drain", f"reason={DRAIN_REASON}")
    agents = [
        f[0]
        for f in _lines("squeue", "-h", "-s", "-o", "%i %j")
        if len(f) == 2 and f[1] == AGENT_STEP_PREFIX + node
    ]
    if agents:
        run("scancel", "--signal=TERM", *agents)
    return agents


def resume(node: str) -> None:
    """Undo `drain` (the node came back into the hostfile before it left Slurm)."""
    run("scontrol", "update", f"nodename={node}", "state=resume")


def release(leaving: list[str]) -> list[str]:
    """Take the `leaving` nodes out of the jobs that hold them (see the module's docstring); the ones
    no job holds any more.

    A job is shrunk once for all its leaving nodes (Slurm 22.05 without accounting resizes a job only
    once); where that fails, a leaving node whose container is gone is set DOWN, which a ``--no-kill``
    job survives (Slurm drops the node from it) and any other fails. Steps still on a gone container
    are cancelled first: Slurm tells their ``srun``, which gives up after KillWait instead of waiting
    forever for tasks that died with the container.
    """
    current = jobs()
    if not current:
        return list(leaving)
    running = steps()
    gone = {n for n in leaving if not reachable(n)}
    held: set[str] = set()
    for job, (state, nodes) in current.items():
        mine = {n for n in leaving if n in nodes}
        if not mine or (state == "CG" and mine <= gone):
            continue  # a completing job's processes on a gone node went with its container
        held |= mine
        on_mine = [(step, used) for step, used in running.get(job, []) if used & mine]
        if state != "R" or any(used & (mine - gone) for _, used in on_mine):
            continue  # pending/completing, or its steps on the leaving nodes are still leaving
        doomed = [step for step, _ in on_mine if step.split(".")[-1].isdigit()]
        if doomed:
            run("scancel", *doomed)
        rest = [n for n in nodes if n not in mine]
        if not rest:
            if mine <= gone:
                run("scancel", job)
                log.info(
                    "job %s ran on %s alone, whose containers are gone: cancelled",
                    job,
                    ",".join(sorted(mine)),
                )
            continue
        done = run("scontrol", "update", f"jobid={job}", f"nodelist={','.join(rest)}")
        if done is not None and done.returncode == 0:
            log.info(
                "job %s shrunk to %s%s",
                job,
                ",".join(rest),
                f" (steps {' '.join(doomed)} cancelled)" if doomed else "",
            )
            continue
        for node in sorted(mine & gone):
            run("scontrol", "update", f"nodename={node}", "state=down", f"reason={DRAIN_REASON}")
            log.info(
                "job %s cannot shrink (%s): %s, whose container is gone, set DOWN", job, _err(done), node
            )
    return [n for n in leaving if n not in held]


def _err(done: subprocess.CompletedProcess[str] | None) -> str:
    return "not run" if done is None else (done.stderr.strip() or f"exit {done.returncode}")
