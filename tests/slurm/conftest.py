"""A private Slurm cluster for the session: munged, slurmctld and slurmd n1..n4 on this machine.

`scripts/slurm/start_cluster.sh` installs Debian's slurm-wlm and munge when missing and starts the
daemons under a temporary directory; the `slurm` tests are skipped (with the reason) when that is
impossible (not root, no apt, daemons failing). At the end every job is cancelled and every daemon
and job process of this cluster is stopped by PID (`scripts/slurm/stop_cluster.sh`).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastrain.testing.waits import poll

REPO = Path(__file__).resolve().parents[2]
SCRIPTS = REPO / "scripts" / "slurm"


def _ports_free(base: int) -> bool:
    """Are slurmctld's port and the four slurmd ports of `base` all unused?"""
    for port in (base, base + 4, base + 5, base + 6, base + 7):
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                return False
    return True


def _free_port_base() -> int:
    """A port base (26817, 26917, ...) whose five ports are free: parallel sessions do not clash."""
    for base in range(26817, 30000, 100):
        if _ports_free(base):
            return base
    raise RuntimeError("no free port range for the private Slurm cluster")


@dataclass
class SlurmCluster:
    """The running private cluster and small helpers around the Slurm commands."""

    directory: Path
    env: dict[str, str]

    def cmd(self, *args: str, check: bool = True, timeout: float = 30) -> str:
        """Run a Slurm command against this cluster; its stdout."""
        done = subprocess.run(
            list(args), env=self.env, capture_output=True, text=True, timeout=timeout, check=False
        )
        if check and done.returncode != 0:
            raise AssertionError(f"{' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
        return done.stdout

    def sbatch(self, *args: str, wrap: str, cwd: Path = REPO) -> str:
        """Submit a batch job; its id."""
        done = subprocess.run(
            ["sbatch", "--parsable", *args, "--wrap", wrap],
            env=self.env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        return done.stdout.strip().split(";")[0]

    def jobs(self) -> list[str]:
        """Ids of the jobs squeue lists (pending, running, completing)."""
        return self.cmd("squeue", "-h", "-o", "%i").split()

    def steps(self, job_id: str) -> dict[str, str]:
        """Step name -> step id of a running job (e.g. ``elastrain-agent-n2`` -> ``7.1``)."""
        out = self.cmd("squeue", "-h", "-s", "-j", job_id, "-o", "%i %j", check=False)
        return {
            name: step for step, name in (line.split(None, 1) for line in out.splitlines() if " " in line)
        }

    def job_field(self, job_id: str, key: str) -> str:
        """One field of ``scontrol show job`` (JobState, ExitCode, ...); '' once it is forgotten."""
        out = self.cmd("scontrol", "show", "job", "--oneliner", job_id, check=False)
        for item in out.split():
            name, _, value = item.partition("=")
            if name == key:
                return value
        return ""

    def wait_gone(self, job_id: str, timeout: float) -> bool:
        """Wait until squeue no longer lists the job; False on timeout."""
        return poll(lambda: job_id not in self.jobs(), timeout, 0.25)

    def cancel_all(self) -> None:
        """Cancel every job of the cluster and wait (briefly) for them to go."""
        self.cmd("scancel", "--full", "--user=root", check=False)
        poll(lambda: not self.jobs(), 20, 0.25)


def _skip(reason: str) -> None:
    pytest.skip(f"private Slurm cluster unavailable: {reason}")


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """Start the cluster once per session; SLURM_CONF points at it while the tests run."""
    if sys.platform != "linux" or os.geteuid() != 0:
        _skip("needs root on Linux (slurmd and munged run as root)")
    missing = [tool for tool in ("slurmctld", "slurmd", "munged") if shutil.which(tool) is None]
    if missing:  # tests install nothing: `make slurm-deps` does
        _skip(f"{', '.join(missing)} not installed (`make slurm-deps` installs slurm-wlm and munge)")
    sys.path.insert(0, str(REPO / "examples"))
    import mnist1d_data

    mnist1d_data.load()  # the dataset cache, once, before the jobs' workers need it
    directory = Path(tempfile.mkdtemp(prefix="elastrain-slurm-"))
    env = dict(os.environ, SLURM_CONF=str(directory / "slurm.conf"))
    env.pop("SLURM_JOB_ID", None)
    started = time.monotonic()
    try:
        done = subprocess.run(
            [str(SCRIPTS / "start_cluster.sh"), str(directory), str(_free_port_base())],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
        )
    except subprocess.TimeoutExpired:
        done = subprocess.CompletedProcess([], 1, "", "timed out after 600 s")
    if done.returncode != 0:
        subprocess.run([str(SCRIPTS / "stop_cluster.sh"), str(directory)], capture_output=True, timeout=60)
        logs = "".join(p.read_text(errors="replace")[-400:] for p in (directory / "log").glob("*.log"))
        shutil.rmtree(directory, ignore_errors=True)
        _skip(f"start_cluster.sh exited {done.returncode}: {done.stderr.strip()[-600:]} {logs}")
    print(f"\nprivate Slurm cluster up in {time.monotonic() - started:.2f} s at {directory}", file=sys.stderr)
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = env["SLURM_CONF"]
    cluster = SlurmCluster(directory, env)
    try:
        yield cluster
    finally:
        cluster.cancel_all()
        subprocess.run([str(SCRIPTS / "stop_cluster.sh"), str(directory)], capture_output=True, timeout=60)
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster; every job a test module leaves behind is cancelled after it."""
    yield slurm_cluster
    slurm_cluster.cancel_all()
