"""`elastrain run`: horovodrun/torchrun-style launcher for elastic jobs.

Starts a torch TCPStore (the process groups' bootstrap store, one prefix per generation; bound to the
coordinator's address only, on an ephemeral port the workers learn from the coordinator: see
``launcher/store.py``), the coordinator, one agent process per local host, and a watcher on the host
source. Returns when the job ends: 0 when training finished, 1 when a worker failed, 2 for bad input.
"""

from __future__ import annotations

import logging
import os
import secrets
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.agent.restart import FAILED_AFTER
from elastrain.contracts.env import WorkerEnv
from elastrain.errors import ConfigError
from elastrain.launcher.agents import AgentStarter, LocalAgentStarter
from elastrain.launcher.hosts import HostSource
from elastrain.launcher.observer import GenerationObserver
from elastrain.launcher.store import start_store
from elastrain.rendezvous.coordinator import Coordinator
from elastrain.rendezvous.records import CoordinatorConfig
from elastrain.runtime.progress import METRICS_URL_ENV, IncidentReporter

if TYPE_CHECKING:
    from elastrain.launcher.metrics_relay import MetricsRelay
    from elastrain.launcher.tensorboard import TensorBoardWriter

log = logging.getLogger("elastrain.run")


@dataclass
class LaunchConfig:
    """Everything `elastrain run` was asked to do, validated."""

    command: list[str]
    hosts: HostSource
    np: int | None = None
    min_np: int | None = None
    max_np: int | None = None
    ledger_dir: Path | None = None
    coordinator_host: str = "127.0.0.1"
    coordinator_port: int = 0
    join_grace_s: float = 5.0
    heartbeat_timeout_s: float = 30.0
    elastic_timeout_s: float = 60.0
    start_timeout_s: float = 120.0
    max_restarts: int = 3
    restart_mode: bool = False
    rejoin: bool = False
    watch_interval_s: float = 0.2
    env: dict[str, str] = field(default_factory=dict)
    tensorboard_dir: Path | None = None  # checked (`launcher.tensorboard.check_tensorboard_dir`)


def check_command(command: list[str]) -> None:
    """Refuse an empty command or a script path that does not exist (before starting anything)."""
    if not command:
        raise ConfigError("no training command given; e.g. `elastrain run -np 2 python train.py`")
    program = Path(command[0]).name
    if program.startswith("python"):
        script = next((a for a in command[1:] if not a.startswith("-")), None)
        if "-m" in command[1:2] or "-c" in command[1:2]:
            return
        if script is not None and not Path(script).exists():
            raise ConfigError(f"script {script} does not exist (looked in {Path.cwd()}); check the path")
    elif "/" in command[0] and not Path(command[0]).exists():
        raise ConfigError(f"program {command[0]} does not exist; check the path")


def check_sizes(np: int | None, min_np: int | None, max_np: int | None) -> None:
    """Refuse sizes that cannot work whatever the hosts: < 1, or --min-np above --max-np."""
    for name, value in (("-np", np), ("--min-np", min_np), ("--max-np", max_np)):
        if value is not None and value < 1:
            raise ConfigError(f"{name} must be at least 1, got {value}")
    if min_np is not None and max_np is not None and min_np > max_np:
        raise ConfigError(f"--min-np {min_np} is larger than --max-np {max_np}; swap them or fix one")


def resolve_sizes(np: int | None, min_np: int | None, max_np: int | None, slots: int) -> tuple[int, int, int]:
    """(min, max, initial) from horovodrun semantics: -np alone is a fixed size."""
    check_sizes(np, min_np, max_np)
    initial = np if np is not None else (min(max_np, slots) if max_np is not None else min_np or slots)
    lo = min_np if min_np is not None else (initial if max_np is None else 1)
    hi = max_np if max_np is not None else (initial if min_np is None else max(initial, slots))
    if initial < lo or initial > hi:
        raise ConfigError(f"-np {initial} must lie between --min-np {lo} and --max-np {hi}")
    if initial > slots and min_np is None:
        raise ConfigError(
            f"-np {initial} is larger than the {slots} slots the hosts offer; add hosts/slots or lower -np"
        )
    if lo > slots and min_np is not None:
        log.warning("--min-np %d is more than the %d slots available now; waiting for hosts", lo, slots)
    return lo, hi, min(initial, max(slots, lo))


class Launcher:
    """Runs one job: store, coordinator, agents, host watcher."""

    def __init__(self, config: LaunchConfig, starter: AgentStarter | None = None) -> None:
        self.config = config
        self.starter = starter or LocalAgentStarter()
        # a replacement launcher (--rejoin) must present the token the running agents and workers know
        self.token = os.environ.get(WorkerEnv.JOB_TOKEN) or secrets.token_hex(16)
        self.run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{self.token[:6]}"
        self.agents: dict[str, subprocess.Popen[bytes]] = {}
        self._stop = threading.Event()
        self.coordinator: Coordinator | None = None
        self.relay: MetricsRelay | None = None  # with --tensorboard-dir: the workers' metrics reach it
        self._coordinator_log_level = logging.getLogger("elastrain.coordinator").level

    def _agent_args(self, host: str) -> list[str]:
        assert self.coordinator is not None
        args = [
            "--coordinator",
            self.coordinator.address,
            "--host",
            host,
            "--max-restarts",
            str(self.config.max_restarts),
        ]
        if self.config.restart_mode:
            args.append("--restart-mode")
        return [*args, "--", *self.config.command]

    def _start_agent(self, host: str) -> None:
        env = dict(os.environ)
        env.update(self.config.env)
        env[WorkerEnv.JOB_TOKEN] = self.token
        env[WorkerEnv.RUN_ID] = self.coordinator.config.run_id if self.coordinator else self.run_id
        env.setdefault(WorkerEnv.COORDINATOR_TIMEOUT, str(self.config.heartbeat_timeout_s))
        # a collective stuck on a hung peer gives up within the same bound the coordinator uses
        env.setdefault(WorkerEnv.COLLECTIVE_TIMEOUT, str(self.config.heartbeat_timeout_s))
        if self.config.ledger_dir is not None:
            env[WorkerEnv.LEDGER_DIR] = str(self.config.ledger_dir)
        if self.relay is not None:
            env[METRICS_URL_ENV] = self.relay.url
        proc = self.starter.start(host, self._agent_args(host), env)
        if proc is not None:
            self.agents[host] = proc

    def run(self) -> int:
        """Start everything, wait for the job to end, clean up; returns the exit code."""
        hosts = self.config.hosts.read()
        lo, hi, initial = resolve_sizes(
            self.config.np, self.config.min_np, self.config.max_np, hosts.total_slots
        )
        if self.config.ledger_dir is not None:
            self.config.ledger_dir.mkdir(parents=True, exist_ok=True)
        self._check_can_listen(self.config.coordinator_port)
        # the store listens on the coordinator's address only, on an ephemeral port: workers learn it
        # from the generations the coordinator sends them (a --rejoin launcher serves a new one). It is
        # torch's import (seconds), after the checks; `_store` stays referenced: collected, it stops.
        try:
            _store, store_address = start_store(self.config.coordinator_host)
        except (OSError, RuntimeError) as exc:
            raise ConfigError(self._cannot_listen(0, exc)) from None
        coord_config = CoordinatorConfig(
            min_np=lo,
            max_np=hi,
            initial_np=initial,
            join_grace_s=self.config.join_grace_s,
            start_timeout_s=self.config.start_timeout_s,
            elastic_timeout_s=self.config.elastic_timeout_s,
            heartbeat_timeout_s=self.config.heartbeat_timeout_s,
            max_restarts=self.config.max_restarts,
            events_path=(self.config.ledger_dir / "events.jsonl") if self.config.ledger_dir else None,
            run_id=self.run_id,
            adopt=self.config.rejoin,
            adopt_grace_s=max(5.0, self.config.join_grace_s),
        )
        try:
            self.coordinator = Coordinator(
                coord_config,
                self.token,
                store_address,
                self._start_agent,
                bind_host=self.config.coordinator_host,
                port=self.config.coordinator_port,
            )
        except OSError as exc:
            raise ConfigError(self._cannot_listen(self.config.coordinator_port, exc)) from None
        environ = self.config.env | dict(os.environ)
        reporter = IncidentReporter(environ)
        native = not self.config.restart_mode
        self.coordinator.on_incident = reporter.report if reporter.enabled and native else None
        try:
            writer = self._tensorboard()
        except OSError as exc:
            self.coordinator.close()
            raise ConfigError(self._cannot_listen(0, exc)) from None
        observer = GenerationObserver(self.coordinator.incidents, native, writer, environ, reporter)
        log.info("coordinator at %s; %d..%d workers, starting %d", self.coordinator.address, lo, hi, initial)
        previous = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
        for sig in previous:
            signal.signal(sig, self._on_signal)
        watcher = threading.Thread(
            target=self.config.hosts.watch,
            args=(self.coordinator.set_hosts, self._stop, self.config.watch_interval_s),
            daemon=True,
        )
        try:
            self.coordinator.set_hosts(hosts)
            watcher.start()
            while not self.coordinator.finished.wait(0.2):
                observer.poll()
                if self._stop.is_set():
                    self.coordinator.abort("interrupted")
                    return 130
            return self._finish()
        finally:
            self._stop.set()
            self._reap_agents()
            self.coordinator.close()
            observer.poll()
            self._close_tensorboard(writer)
            if not observer.flush(10.0):
                log.warning("the world size could not be sent to the control plane at %s", reporter.endpoint)
            logging.getLogger("elastrain.coordinator").setLevel(self._coordinator_log_level)
            if reporter.enabled and not reporter.flush(10.0):
                log.warning("some incidents could not be sent to the control plane at %s", reporter.endpoint)
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _tensorboard(self) -> TensorBoardWriter | None:
        """With --tensorboard-dir: the writer (imports torch.utils.tensorboard) and the relay the
        workers send their metrics to (before any agent starts: they pass its URL on)."""
        if self.config.tensorboard_dir is None:
            return None
        from elastrain.launcher.metrics_relay import MetricsRelay
        from elastrain.launcher.tensorboard import TensorBoardWriter

        writer = TensorBoardWriter(self.config.tensorboard_dir)

        def record(points: list[dict[str, object]]) -> None:
            for point in points:
                at = point.get("at")  # when `elastrain.report` was called (a batch arrives later)
                writer.progress(point, walltime=at if isinstance(at, float) else None)

        self.relay = MetricsRelay(self.config.coordinator_host, self.token, record)
        log.info("TensorBoard scalars go to %s", self.config.tensorboard_dir)
        return writer

    def _close_tensorboard(self, writer: TensorBoardWriter | None) -> None:
        if self.relay is not None:
            self.relay.close()  # the last reports in flight are answered (and written) first
            self.relay = None
        if writer is not None:
            writer.close()

    def _check_can_listen(self, port: int) -> None:
        """Refuse an address that is not this machine's, or a port in use, before anything starts
        (the store would otherwise retry connecting to it for minutes)."""
        family = socket.AF_INET6 if ":" in self.config.coordinator_host else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind((self.config.coordinator_host, port))
            except OSError as exc:
                raise ConfigError(self._cannot_listen(port, exc)) from None

    def _cannot_listen(self, port: int, exc: BaseException) -> str:
        where = f"{self.config.coordinator_host}:{port or 'any port'}"
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return (
            f"cannot listen on {where} ({reason}); give an address of this machine and a free port "
            "(--rdzv-endpoint / --coordinator-host, --coordinator-port)"
        )

    def _on_signal(self, signum: int, _frame: object) -> None:
        print(f"elastrain: got signal {signum}, stopping the job", file=sys.stderr)
        self._stop.set()

    def _finish(self) -> int:
        assert self.coordinator is not None
        # the job is over: workers dropping their connections now is no news after its last line
        coordinator_log = logging.getLogger("elastrain.coordinator")
        self._coordinator_log_level = coordinator_log.level
        coordinator_log.setLevel(logging.ERROR)
        self._reap_agents()  # their last output lines come before the verdict
        print(f"elastrain: generations of this run\n{self.coordinator.incidents.summary()}", file=sys.stderr)
        outcome = self.coordinator.outcome
        if outcome is None:
            return 130
        if outcome.success:
            print(f"elastrain: {outcome.message}", file=sys.stderr)
            return 0
        _, _, detail = outcome.message.partition("\n")
        if self.config.restart_mode and detail.startswith(FAILED_AFTER):
            print(f"elastrain: {detail}", file=sys.stderr)  # one line: rank, host, exit code, its last error
        else:
            print(f"elastrain: job failed: {outcome.message}", file=sys.stderr)
        return 1

    def _reap_agents(self) -> None:
        assert self.coordinator is not None
        failed = self.coordinator.outcome is None or not self.coordinator.outcome.success
        deadline = time.monotonic() + (10.0 if failed else 600.0)
        if failed:
            for proc in self.agents.values():
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
        for proc in self.agents.values():
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        # agents we did not start (adopted after --rejoin, remote hosts) disconnect when their workers end
        while self.coordinator.agents and time.monotonic() < deadline:
            time.sleep(0.05)
