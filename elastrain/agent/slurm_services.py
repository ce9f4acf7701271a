"""The Slurm framework's services: munged everywhere, slurmctld in the launcher, slurmd in each worker.

A ``--framework slurm`` cluster is a real Slurm cluster inside its containers. The node daemon's
`Supervisor` runs, in every container, as the tenant and without capabilities:

* ``munged`` with the cluster's own key (``/etc/elastrain/keys/munge.key``, 0600, the tenant's), its
  socket, PID, seed and log files under ``/tmp/elastrain-slurm/munge``, started once the container's
  host name resolves (munged puts its address into every credential);
* in the launcher, ``python -m elastrain.agent.slurm_services launcher``: renders ``slurm.conf`` from
  the hostfile (`elastrain.agent.slurm_conf`), runs ``slurmctld -D`` and watches the hostfile. When the
  set of workers changes it rewrites the config and restarts slurmctld (Slurm 22.05 cannot add or
  remove nodes on ``scontrol reconfigure``; jobs and node states survive in its StateSaveLocation).
  A worker that leaves the
  hostfile (scale-in) is drained first, the ``elastrain run --slurm`` agent steps on it get SIGTERM
  (their workers leave gracefully, the job shrinks), its jobs are shrunk to their other nodes, and
  only then it leaves slurm.conf (`elastrain.agent.slurm_scale`);
* in a worker, ``python -m elastrain.agent.slurm_services worker``: waits for its host name in the
  hostfile, renders the same config (itself included), runs ``slurmd -D``, re-renders on every
  hostfile change, and sends slurmd SIGHUP (re-read the config, register) while slurmctld does not
  know the node as registered: a new node is idle within about a second of slurmctld's restart,
  and nodes already running jobs are never made to reconfigure.

The runners restart their daemon if it exits, and stop it when they get SIGTERM (or die: the daemon
gets SIGTERM with them). What they do is logged to the container's log, the daemons' own logs are in
``/tmp/elastrain-slurm/log``.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from elastrain.agent import slurm_scale
from elastrain.agent.services import KEYS_DIR, Service
from elastrain.agent.slurm_conf import (
    MUNGE_DIR,
    MUNGE_SOCKET,
    SLURM_CONF_PATH,
    SLURM_DIR,
    TASK_PROLOG,
    controller_host,
    hostfile_workers,
    layout,
    render_gres_conf,
    render_slurm_conf,
    render_task_prolog,
    write_if_changed,
)
from elastrain.errors import HostfileError
from elastrain.hostfile import read_hostfile
from elastrain.procutil import die_with_parent

log = logging.getLogger("elastrain.slurm")

MUNGED, SLURMCTLD, SLURMD = "/usr/sbin/munged", "/usr/sbin/slurmctld", "/usr/sbin/slurmd"
MUNGE_KEY = KEYS_DIR / "munge.key"
HOSTFILE_DEFAULT = "/etc/mpi/hostfile"
POLL_S = 0.5
REGISTER_RETRY_S = 1.0


def _own_address(timeout: float = 30.0) -> str | None:
    """This container's address once its host name resolves (the server writes the cluster's
    /etc/hosts a moment after the container starts); None after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return socket.gethostbyname(socket.gethostname())
        except OSError:
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)


def _prepare_munge() -> None:
    # munged encodes its host's address (looked up once, at start) into every credential: started
    # before /etc/hosts names the container, it encodes 0.0.0.0 and srun's I/O set-up then fails
    if _own_address() is None:
        log.warning("%s does not resolve yet; starting munged anyway", socket.gethostname())
    # munged wants its socket directory reachable by every user (0711) and its files private
    SLURM_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
    MUNGE_DIR.mkdir(mode=0o711, exist_ok=True)
    os.chmod(MUNGE_DIR, 0o711)


def slurm_services(role: str, environ: Mapping[str, str]) -> list[Service]:
    """munged, and slurmctld's (launcher) or slurmd's (worker) runner; none where the image has no
    Slurm or the cluster no munge key (the reason is logged)."""
    missing = [p for p in (MUNGED, SLURMCTLD, SLURMD) if not Path(p).exists()]
    if missing:
        log.warning(
            "framework slurm: %s missing in this image; build it with "
            "`elastrain image build --framework slurm`",
            ", ".join(missing),
        )
        return []
    if not MUNGE_KEY.exists():
        log.warning("framework slurm: no munge key at %s; Slurm is not started", MUNGE_KEY)
        return []
    # in the foreground munged logs to stderr only: to its log file, not the container's log
    quiet = ["/bin/sh", "-c", f'exec "$0" "$@" 2>>{MUNGE_DIR / "munged.log"}']
    munged = Service(
        "munged",
        [
            *quiet,
            MUNGED,
            "--foreground",
            f"--socket={MUNGE_SOCKET}",
            f"--key-file={MUNGE_KEY}",
            f"--pid-file={MUNGE_DIR / 'munged.pid'}",
            f"--seed-file={MUNGE_DIR / 'munged.seed'}",
        ],
        _prepare_munge,
    )
    runner_role = "launcher" if role == "launcher" else "worker"
    name = "slurmctld" if runner_role == "launcher" else "slurmd"
    runner = Service(name, [sys.executable, "-m", "elastrain.agent.slurm_services", runner_role])
    return [munged, runner]


def _wait_for(path: Path, stop: threading.Event, timeout: float) -> bool:
    """Wait until `path` exists; False after `timeout` or once `stop` is set."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline or stop.wait(0.1):
            return False
    return True


class Daemon:
    """One Slurm daemon in the foreground, a child of the runner (SIGTERM when the runner dies)."""

    def __init__(self, name: str, argv: list[str]) -> None:
        self.name, self.argv = name, argv
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0

    def start(self) -> None:
        """Start the daemon (its output goes nowhere: it has its own log file)."""
        # -D copies the daemon's log to stdout: the log file is enough (the container's log stays
        # readable; the runner shows the file's last lines when the daemon exits)
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=die_with_parent(signal.SIGTERM),
        )
        self.started = time.monotonic()
        log.info("started %s (pid %d)", self.name, self.proc.pid)

    def exited(self) -> int | None:
        """Its exit code once it has exited, else None."""
        return None if self.proc is None else self.proc.poll()

    def signal(self, signum: int) -> None:
        """Send `signum` to the daemon if it runs."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signum)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM, then SIGKILL after `timeout` (slurmctld saves its state on SIGTERM)."""
        if self.proc is None:
            return
        self.signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _log_tail(name: str, lines: int = 5) -> str:
    """The last lines of a daemon's log file, on one line."""
    try:
        text = (SLURM_DIR / "log" / f"{name}.log").read_text(errors="replace")
    except OSError:
        return ""
    return " | ".join(text.strip().splitlines()[-lines:])


class Runner:
    """Keeps this container's Slurm daemon running with a config that follows the hostfile."""

    def __init__(self, role: str, environ: Mapping[str, str]) -> None:
        self.role, self.environ = role, environ
        self.hostfile = Path(environ.get("ELASTRAIN_HOSTFILE") or HOSTFILE_DEFAULT)
        self.me = environ.get("ELASTRAIN_CONTAINER") or socket.gethostname()
        self.controller = controller_host(environ.get("ELASTRAIN_CLUSTER", "elastrain"))
        self.stop = threading.Event()
        self.workers: dict[str, int] = {}
        self.nodes: tuple[str, ...] = ()  # the nodes of the config the daemon runs with
        self.drained: set[str] = set()
        self.daemon: Daemon | None = None

    def read_workers(self) -> dict[str, int] | None:
        """The hostfile's workers (name -> slots); None while it cannot be read."""
        try:
            return hostfile_workers(read_hostfile(self.hostfile), self.controller)
        except HostfileError as exc:
            log.warning("%s", exc)
            return None

    def render(self, workers: Mapping[str, int], extra: tuple[str, ...]) -> tuple[str, ...]:
        """Write slurm.conf (and gres.conf, the task prolog) for `workers` + `extra`; the node names."""
        lay = layout(self.environ, workers, extra)
        for sub in ("state", "spool", "log"):
            (SLURM_DIR / sub).mkdir(parents=True, exist_ok=True)
        write_if_changed(SLURM_CONF_PATH, render_slurm_conf(lay))
        write_if_changed(SLURM_CONF_PATH.with_name("gres.conf"), render_gres_conf(self.environ))
        write_if_changed(TASK_PROLOG, render_task_prolog(self.environ), mode=0o755)
        return lay.node_names

    def run(self) -> int:
        """Start the daemon and follow the hostfile until SIGTERM; the exit code."""
        if not _wait_for(MUNGE_SOCKET, self.stop, 60):
            log.error("munged's socket %s did not appear in 60 s", MUNGE_SOCKET)
            return 1
        try:
            if self.role == "launcher":
                self._launcher()
            else:
                self._worker()
        finally:
            if self.daemon is not None:
                self.daemon.stop()
        return 0

    def _keep_alive(self, argv_name: str) -> None:
        """Start the daemon again if it exited (1 s after, logging its last log lines)."""
        assert self.daemon is not None
        code = self.daemon.exited()
        if code is None:
            return
        log.warning("%s exited with %s: %s", argv_name, code, _log_tail(argv_name))
        if not self.stop.wait(1.0):
            self.daemon.start()
            if self.role == "launcher":
                self._after_ctld_start()

    # --- launcher: slurmctld ------------------------------------------------------------------

    def _launcher(self) -> None:
        self.workers = self.read_workers() or {}
        self.nodes = self.render(self.workers, ())
        # -i: ignore unreadable state (e.g. jobs on nodes that left while it was down)
        self.daemon = Daemon("slurmctld", [SLURMCTLD, "-D", "-i"])
        self.daemon.start()
        self._after_ctld_start()
        log.info("controller up with nodes %s", ",".join(self.nodes) or "(none)")
        while not self.stop.wait(POLL_S):
            self._keep_alive("slurmctld")
            workers = self.read_workers()
            if workers is None:
                continue
            self.workers = workers
            self._follow(workers)

    def _after_ctld_start(self, timeout: float = 30.0) -> None:
        """Wait until slurmctld answers. The nodes it knew keep their state (StateSaveLocation); new
        ones register by themselves (their runners see them unknown and SIGHUP their slurmd): no
        ``scontrol reconfigure``, which would make every slurmd re-read its config, and a step
        launched on a node right then can fail (srun: "io_init_msg_unpack: unpack error")."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop.is_set():
            done = slurm_scale.run("scontrol", "ping")
            if done is not None and done.returncode == 0 and "UP" in done.stdout:
                return
            if self.daemon is not None and self.daemon.exited() is not None:
                return
            self.stop.wait(0.1)
        log.warning("slurmctld did not answer within %.0f s", timeout)

    def _follow(self, workers: Mapping[str, int]) -> None:
        """Bring slurmctld's nodes in line with the hostfile's workers (`slurm_scale`: leavers are
        drained, their jobs shrunk, then they go)."""
        leaving = [n for n in self.nodes if n not in workers]
        for name in leaving:
            if name not in self.drained:
                agents = slurm_scale.drain(name)
                self.drained.add(name)
                told = f", agent steps {' '.join(agents)} told to leave" if agents else ""
                log.info("%s left the hostfile: drained%s", name, told)
        free = slurm_scale.release(leaving) if leaving else []
        kept = tuple(n for n in leaving if n not in free)
        for name in [n for n in self.drained if n in workers]:  # scaled out again before it went
            slurm_scale.resume(name)
            self.drained.discard(name)
        lay = layout(self.environ, workers, kept)
        if lay.node_names == self.nodes and SLURM_CONF_PATH.exists():
            return
        t0 = time.monotonic()
        self.nodes = self.render(workers, kept)
        self.drained &= set(self.nodes)
        assert self.daemon is not None
        self.daemon.stop()
        self.daemon.start()
        self._after_ctld_start()
        log.info(
            "nodes now %s (slurmctld restarted in %.2f s)",
            ",".join(self.nodes) or "(none)",
            time.monotonic() - t0,
        )

    # --- worker: slurmd -----------------------------------------------------------------------

    def _worker(self) -> None:
        waited = False
        while not self.stop.is_set():
            workers = self.read_workers()
            if workers is not None and self.me in workers:
                break
            if not waited:
                log.info("waiting for %s in %s", self.me, self.hostfile)
                waited = True
            self.stop.wait(0.2)
        if self.stop.is_set():
            return
        self.nodes = self.render(self.read_workers() or {}, (self.me,))
        self.daemon = Daemon("slurmd", [SLURMD, "-D", "-N", self.me])
        self.daemon.start()
        checked_at = time.monotonic()
        while not self.stop.wait(POLL_S):
            self._keep_alive("slurmd")
            workers = self.read_workers()
            if workers is not None:
                nodes = layout(self.environ, workers, (self.me,)).node_names
                if nodes != self.nodes:  # read at the next restart or registration
                    self.nodes = self.render(workers, (self.me,))
            if time.monotonic() - checked_at > REGISTER_RETRY_S:
                checked_at = time.monotonic()
                if not self._registered():
                    # slurmctld did not have this node yet when slurmd started (it restarts with
                    # the new config a moment later): SIGHUP makes slurmd re-read it and register
                    self.daemon.signal(signal.SIGHUP)

    def _registered(self) -> bool:
        """Does slurmctld know this node as registered (not UNKNOWN, responding)? True when unsure."""
        done = slurm_scale.run("scontrol", "show", "node", "--oneliner", self.me, timeout=5)
        if done is None or done.returncode != 0:
            return "not found" not in ("" if done is None else done.stderr + done.stdout)
        state = next((f[6:] for f in done.stdout.split() if f.startswith("State=")), "")
        return bool(state) and not state.startswith("UNKNOWN") and not state.endswith("*")


def main(argv: list[str] | None = None) -> int:
    """``python -m elastrain.agent.slurm_services launcher|worker`` (run by the node daemon)."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or args[0] not in ("launcher", "worker"):
        print("usage: python -m elastrain.agent.slurm_services launcher|worker", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="elastrain slurm: %(message)s")
    os.environ["SLURM_CONF"] = str(SLURM_CONF_PATH)
    runner = Runner(args[0], dict(os.environ))
    signal.signal(signal.SIGTERM, lambda *_: runner.stop.set())
    signal.signal(signal.SIGINT, lambda *_: runner.stop.set())
    return runner.run()


if __name__ == "__main__":
    sys.exit(main())
