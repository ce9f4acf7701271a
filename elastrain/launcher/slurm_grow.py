"""An elastic ``elastrain run --slurm`` job grows its own allocation onto nodes that join its partition.

The launcher runs inside the allocation (salloc, sbatch). With ``--max-np`` and fewer slots than
that, `AllocationGrower` polls its partition for idle nodes (``sinfo -t idle``); once some are found
and a short settle window has passed (more nodes of the same scale-out may still be registering),
it expands the job onto them the way Slurm documents it (``permit_job_expansion``):

1. ``salloc --no-shell -N K -w NODES --dependency=expand:J``: a helper job on the new nodes;
2. ``scontrol update jobid=HELPER NumNodes=0``: the helper hands its nodes over to job J;
3. ``scontrol update jobid=J NumNodes=ALL``: J takes them; the helper, now empty, is cancelled.

`elastrain.launcher.hosts.SlurmHosts` then sees the new NodeList (``scontrol show job J``) and the
coordinator starts agents on the new nodes (srun steps), so the job grows live.

Slurm 22.05 without accounting resizes a job only ONCE ("Job update not available right now, the DB
index is being set" afterwards): the grower expands at most once, by every idle node it found within
the settle window (up to what ``--max-np`` can use), and a grown job can then not be shrunk with
``scontrol update NodeList=`` either (scale-in falls back to setting the gone nodes DOWN). A job
without ``--max-np`` (fixed size) never expands.
"""

from __future__ import annotations

import logging
import math
import os
import re
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping

from elastrain.agent import slurm_scale
from elastrain.errors import ConfigError

log = logging.getLogger("elastrain.slurm")

Runner = Callable[..., "subprocess.CompletedProcess[str] | None"]

_GRANTED_RE = re.compile(r"Granted job allocation (\d+)")
_EXPORT_RE = re.compile(r"^export (SLURM_\w+)=\"?([^\"]*)\"?\s*$", re.MULTILINE)
# scontrol writes slurm_job_J_resize.{sh,csh} into its working directory: keep them out of the user's
_WORKDIR = tempfile.gettempdir()


def run_slurm(*argv: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str] | None:
    """A Slurm command's result, or None when it could not run (missing, timed out)."""
    return slurm_scale.run(*argv, timeout=timeout, cwd=_WORKDIR)


def show_job(job_id: str, runner: Runner = run_slurm) -> dict[str, str] | None:
    """``scontrol show job -o J`` as key -> value; None while it cannot be read (slurmctld restarting)."""
    done = runner("scontrol", "show", "job", "--oneliner", job_id)
    if done is None or done.returncode != 0:
        return None
    fields: dict[str, str] = {}
    for token in done.stdout.split():
        key, sep, value = token.partition("=")
        if sep and key not in fields:  # the first NodeList= is the job's (ReqNodeList/ExcNodeList differ)
            fields[key] = value
    return fields if "JobId" in fields else None


def job_nodes(job_id: str, runner: Runner = run_slurm) -> list[str] | None:
    """The nodes job `job_id` holds now, in order; None while unknown (not running, unreadable)."""
    from elastrain.launcher.slurm import expand_hostlist

    fields = show_job(job_id, runner)
    if fields is None or fields.get("JobState") not in ("RUNNING", "CONFIGURING"):
        return None
    nodelist = fields.get("NodeList", "")
    if nodelist in ("", "(null)"):
        return None
    try:
        return expand_hostlist(nodelist)
    except ConfigError:
        return None


def idle_nodes(partition: str | None, runner: Runner = run_slurm) -> list[str]:
    """The idle nodes of `partition` (all partitions when None), sorted; [] when sinfo fails."""
    argv = ["sinfo", "--noheader", "--Node", "--states=idle", "--format=%N"]
    if partition:
        argv.append(f"--partition={partition}")
    done = runner(*argv)
    if done is None or done.returncode != 0:
        return []
    return sorted({line.strip() for line in done.stdout.splitlines() if line.strip()})


def resize_env(job_id: str, workdir: str = _WORKDIR) -> dict[str, str]:
    """The SLURM_* variables of ``slurm_job_J_resize.sh`` (what a grown job's shell should export)."""
    try:
        with open(os.path.join(workdir, f"slurm_job_{job_id}_resize.sh"), encoding="utf-8") as script:
            return dict(_EXPORT_RE.findall(script.read()))
    except OSError:
        return {}


class AllocationGrower:
    """Expands job `job_id` (once) onto idle nodes of its partition while it has fewer than `max_np` slots.

    `poll` is one look (tests drive it with a fake runner and clock); `run` polls until stopped or done.
    """

    def __init__(
        self,
        job_id: str,
        partition: str | None,
        slots_per_node: int,
        max_np: int,
        settle_s: float = 3.0,
        max_settle_s: float = 15.0,
        attempts: int = 3,
        runner: Runner = run_slurm,
        clock: Callable[[], float] = time.monotonic,
        environ: MutableMapping[str, str] | None = None,
    ) -> None:
        self.job_id = job_id
        self.partition = partition
        self.slots_per_node = max(1, slots_per_node)
        self.max_np = max_np
        self.settle_s = settle_s
        self.max_settle_s = max_settle_s
        self.attempts = attempts
        self.runner = runner
        self.clock = clock
        self.environ = os.environ if environ is None else environ
        self.done = False  # expanded (once-only), or gave up
        self.added: list[str] = []
        self._seen: frozenset[str] = frozenset()
        self._first_seen: float | None = None
        self._changed: float = 0.0

    def needed(self, nodes: list[str]) -> int:
        """How many more nodes the job could use (0 once it has `max_np` slots)."""
        missing = self.max_np - len(nodes) * self.slots_per_node
        return max(0, math.ceil(missing / self.slots_per_node))

    def poll(self, nodes: list[str]) -> list[str]:
        """One look with the job on `nodes`: the nodes it was expanded onto ([] when not now)."""
        need = 0 if self.done else self.needed(nodes)
        idle = [n for n in idle_nodes(self.partition, self.runner) if n not in nodes] if need else []
        if not idle:
            self._seen, self._first_seen = frozenset(), None
            return []
        now = self.clock()
        if frozenset(idle) != self._seen:  # new nodes keep coming: the scale-out is still registering
            self._seen, self._changed = frozenset(idle), now
            if self._first_seen is None:
                self._first_seen = now
        assert self._first_seen is not None
        settled = now - self._changed >= self.settle_s or now - self._first_seen >= self.max_settle_s
        if len(idle) < need and not settled:
            return []
        return self.expand(idle[:need])

    def expand(self, new: list[str]) -> list[str]:
        """Steps 1-3 of the module's docstring; `new` on success, [] otherwise (retried `attempts` times)."""
        job = self.job_id
        argv = ["salloc", "--no-shell", "--immediate=30", f"--nodes={len(new)}"]
        argv.append(f"--nodelist={','.join(new)}")
        if self.partition:
            argv.append(f"--partition={self.partition}")
        argv += [f"--dependency=expand:{job}", f"--job-name=elastrain-grow-{job}"]
        done = self.runner(*argv, timeout=60.0)
        match = _GRANTED_RE.search((done.stderr + done.stdout) if done is not None else "")
        if done is None or done.returncode != 0 or match is None:
            return self._failed(f"salloc onto {','.join(new)}: {_err(done)}", None)
        helper = match.group(1)
        handed = self.runner("scontrol", "update", f"jobid={helper}", "NumNodes=0")
        if handed is None or handed.returncode != 0:
            return self._failed(f"scontrol update jobid={helper} NumNodes=0: {_err(handed)}", helper)
        merged = self.runner("scontrol", "update", f"jobid={job}", "NumNodes=ALL")
        self.runner("scancel", helper)
        if merged is None or merged.returncode != 0:
            self.done = True  # the resize was spent (or the job cannot be resized): do not try again
            log.warning("job %s could not take in %s: %s", job, ",".join(new), _err(merged))
            return []
        self.done, self.added = True, list(new)
        # what the resize script would export: the agents' srun steps see the grown allocation
        self.environ.update(resize_env(job))
        log.info("job %s expanded onto %s (helper job %s)", job, ",".join(new), helper)
        return list(new)

    def _failed(self, why: str, helper: str | None) -> list[str]:
        if helper is not None:
            self.runner("scancel", helper)
        self.attempts -= 1
        self.done = self.attempts <= 0
        self._seen, self._first_seen = frozenset(), None
        log.warning("cannot expand job %s (%s)%s", self.job_id, why, "; giving up" if self.done else "")
        return []

    def run(self, nodes: Callable[[], list[str]], stop: threading.Event, interval_s: float = 1.0) -> None:
        """Poll until `stop` is set or the job has expanded (or given up)."""
        while not self.done and not stop.wait(interval_s):
            try:
                self.poll(nodes())
            except Exception:  # a bug here must not take the job down: it just stops growing
                log.exception("the allocation grower of job %s stopped", self.job_id)
                return


def grower_for(
    env: Mapping[str, str], slots_per_node: int, max_np: int | None, initial_slots: int
) -> AllocationGrower | None:
    """The grower of the allocation `env` describes, or None: no --max-np, not in a job, already at max."""
    job = env.get("SLURM_JOB_ID")
    if max_np is None or not job or initial_slots >= max_np:
        return None
    return AllocationGrower(job, env.get("SLURM_JOB_PARTITION"), slots_per_node, max_np)


def _err(done: subprocess.CompletedProcess[str] | None) -> str:
    if done is None:
        return "not run"
    return (done.stderr.strip() or done.stdout.strip() or f"exit {done.returncode}").splitlines()[-1]
