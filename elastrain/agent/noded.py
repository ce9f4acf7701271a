"""The node daemon: a container's init program, through which a launcher starts agents in it.

Every container of a cluster on the container backend runs ``python -m elastrain.agent.noded``. It
listens on `NODE_PORT` and, for a launcher that presents the cluster's secret
(``ELASTRAIN_NODE_SECRET``, the same in every container of the cluster and nowhere else), starts an
``elastrain agent`` for the job in this container: with this container's environment (its GPUs, its
hostname) plus the job's variables. This is how ``elastrain run --hostfile /etc/mpi/hostfile`` typed in
the launcher container reaches the worker containers, as ``horovodrun`` reaches hosts through ssh.

One connection per agent, newline-delimited JSON:

* launcher -> daemon: ``{"secret": S, "agent_args": [...], "env": {...}}``, later ``{"signal": N}``;
* daemon -> launcher: ``{"started": pid}``, then ``{"out": text}`` chunks, then ``{"exit": code}``.

When the launcher's connection breaks, the agent goes on (it reconnects to a replacement launcher
started with ``--rejoin``, or exits on its own when the coordinator stays away).
"""

from __future__ import annotations

import argparse
import hmac
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
from typing import Any

from elastrain.agent.services import LAB_TOKEN_ENV, Supervisor, container_services

NODE_PORT = 29600
SECRET_ENV = "ELASTRAIN_NODE_SECRET"
# set per container by the backend; a job's environment never overrides them
CONTAINER_OWN = (
    "HOSTNAME",
    "HOME",
    "USER",
    "PATH",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
    "ELASTRAIN_VISIBLE_GPUS",
    "ELASTRAIN_CONTAINER",
    "ELASTRAIN_CONTAINER_ROLE",
    "ELASTRAIN_CONTAINER_ADDRESS",
    SECRET_ENV,
)
_MAX_REQUEST = 1 << 20

log = logging.getLogger("elastrain.noded")


def _send(sock: socket.socket, lock: threading.Lock, message: dict[str, Any]) -> bool:
    data = (json.dumps(message) + "\n").encode()
    with lock:
        try:
            sock.sendall(data)
            return True
        except OSError:
            return False


def _read_line(stream: Any) -> dict[str, Any] | None:
    line = stream.readline(_MAX_REQUEST)
    if not line:
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class NodeDaemon:
    """Accepts agent requests authenticated by the cluster secret and supervises the agents."""

    def __init__(
        self, secret: str, host: str = "0.0.0.0", port: int = NODE_PORT, supervisor: Supervisor | None = None
    ) -> None:
        if not secret:
            raise SystemExit(f"elastrain noded: {SECRET_ENV} is not set; the container backend sets it")
        self.secret = secret.encode()
        self.server = socket.create_server((host, port), reuse_port=False, backlog=64)
        self.agents: dict[int, subprocess.Popen[bytes]] = {}
        self._lock = threading.Lock()
        self.supervisor = supervisor

    @property
    def port(self) -> int:
        """The port the daemon listens on."""
        return int(self.server.getsockname()[1])

    def serve_forever(self) -> None:
        """Accept connections until the process is stopped."""
        while True:
            try:
                conn, peer = self.server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _serve(self, conn: socket.socket, peer: tuple[str, int]) -> None:
        send_lock = threading.Lock()
        with conn:
            stream = conn.makefile("rb")
            conn.settimeout(10.0)
            try:
                request = _read_line(stream)
            except OSError:
                return
            conn.settimeout(None)
            if request is None or not hmac.compare_digest(
                str(request.get("secret", "")).encode(), self.secret
            ):
                log.warning("refused a request from %s: wrong cluster secret", peer[0])
                _send(conn, send_lock, {"error": "wrong cluster secret (ELASTRAIN_NODE_SECRET)"})
                return
            try:
                proc = self._start(request)
            except (OSError, ValueError) as exc:
                _send(conn, send_lock, {"error": f"cannot start the agent: {exc}"})
                return
            _send(conn, send_lock, {"started": proc.pid})
            threading.Thread(target=self._forward_signals, args=(stream, proc), daemon=True).start()
            assert proc.stdout is not None
            for chunk in iter(lambda: os.read(proc.stdout.fileno(), 65536), b""):  # type: ignore[union-attr]
                _send(conn, send_lock, {"out": chunk.decode(errors="replace")})  # a gone launcher: drop
            code = proc.wait()
            with self._lock:
                self.agents.pop(proc.pid, None)
            _send(conn, send_lock, {"exit": code if code >= 0 else 128 - code})
            try:  # the signal reader holds a file on the socket: shut it down, not just close it
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def _start(self, request: dict[str, Any]) -> subprocess.Popen[bytes]:
        args = request.get("agent_args")
        job_env = request.get("env") or {}
        if not isinstance(args, list) or not all(isinstance(a, str) for a in args):
            raise ValueError("agent_args must be a list of strings")
        if not isinstance(job_env, dict):
            raise ValueError("env must be an object")
        env = dict(os.environ)
        env.update({str(k): str(v) for k, v in job_env.items() if k not in CONTAINER_OWN})
        env.pop(SECRET_ENV, None)  # the job needs neither
        env.pop(LAB_TOKEN_ENV, None)
        proc = subprocess.Popen(
            [sys.executable, "-m", "elastrain.agent.agent", *args],
            env=env,
            cwd=env.get("HOME") or "/",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with self._lock:
            self.agents[proc.pid] = proc
        log.info("started agent pid %d: %s", proc.pid, " ".join(args[:6]))
        return proc

    @staticmethod
    def _forward_signals(stream: Any, proc: subprocess.Popen[bytes]) -> None:
        while True:
            try:
                message = _read_line(stream)
            except OSError:
                return
            if message is None:
                return  # the launcher went away: the agent carries on (see the module docstring)
            signum = message.get("signal")
            if isinstance(signum, int) and signum in (signal.SIGTERM, signal.SIGINT, signal.SIGKILL):
                try:
                    proc.send_signal(signum)
                except ProcessLookupError:
                    return

    def stop(self, _signum: int = 0, _frame: object = None) -> None:
        """Stop accepting; SIGTERM every agent (their workers leave), then exit."""
        self.server.close()
        with self._lock:
            agents = list(self.agents.values())
        for proc in agents:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in agents:
            try:
                proc.wait(timeout=8)
            except subprocess.TimeoutExpired:
                proc.kill()
        if self.supervisor is not None:
            self.supervisor.stop()
        raise SystemExit(0)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (the container's command)."""
    parser = argparse.ArgumentParser(prog="elastrain-noded")
    parser.add_argument("--port", type=int, default=NODE_PORT)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="elastrain noded: %(message)s")
    supervisor = Supervisor(container_services(os.environ))
    daemon = NodeDaemon(os.environ.get(SECRET_ENV, ""), port=args.port, supervisor=supervisor)
    supervisor.start()
    signal.signal(signal.SIGTERM, daemon.stop)
    signal.signal(signal.SIGINT, daemon.stop)
    print(
        f"elastrain noded: container {socket.gethostname()} ready, agents on port {daemon.port}",
        flush=True,
    )
    daemon.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
