"""The launcher's side of the node daemon: start an agent in another container, like ``ssh host cmd``.

``python -m elastrain.launcher.node_client --host H [--port P] -- AGENT_ARGS...`` connects to the node
daemon of container H (retrying while the container starts), presents the cluster secret from
``ELASTRAIN_NODE_SECRET``, prints the agent's output, passes SIGTERM/SIGINT on, and exits with the
agent's exit code, so the launcher supervises it as if the agent were its own child.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from elastrain.agent.noded import NODE_PORT, SECRET_ENV
from elastrain.launcher.agents import AgentStarter, LocalAgentStarter, is_local_host

# what a job's agents must not inherit from the launcher container (each container has its own)
_NOT_FORWARDED = ("HOSTNAME", "PWD", "OLDPWD", "SHLVL", "TERM", "_")


def _connect(host: str, port: int, deadline_s: float) -> socket.socket:
    deadline = time.monotonic() + deadline_s
    while True:
        try:
            return socket.create_connection((host, port), timeout=5)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise SystemExit(f"elastrain: cannot reach the node daemon of {host}:{port}: {exc}") from None
            time.sleep(0.25)


def run_remote(host: str, port: int, agent_args: list[str], connect_timeout_s: float = 60.0) -> int:
    """Start the agent through `host`'s node daemon and relay it until it exits; its exit code."""
    secret = os.environ.get(SECRET_ENV, "")
    if not secret:
        raise SystemExit(f"elastrain: {SECRET_ENV} is not set: run this in a cluster's launcher container")
    env = {k: v for k, v in os.environ.items() if k not in _NOT_FORWARDED and k != SECRET_ENV}
    sock = _connect(host, port, connect_timeout_s)
    sock.settimeout(None)
    lock = threading.Lock()

    def send(message: dict[str, object]) -> None:
        with lock:
            try:
                sock.sendall((json.dumps(message) + "\n").encode())
            except OSError:
                pass

    def on_signal(signum: int, _frame: object) -> None:
        send({"signal": int(signum)})

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    send({"secret": secret, "agent_args": agent_args, "env": env})
    stream = sock.makefile("rb")
    code = 1
    for line in stream:
        try:
            message = json.loads(line)
        except ValueError:
            continue
        if "out" in message:
            sys.stdout.write(message["out"])
            sys.stdout.flush()
        elif "exit" in message:
            code = int(message["exit"])
            break
        elif "error" in message:
            print(f"elastrain: node daemon of {host}: {message['error']}", file=sys.stderr)
            code = 1
            break
    sock.close()
    return code


class NodeAgentStarter(AgentStarter):
    """Agents of other containers go through their node daemons; this container's own is a child."""

    def __init__(self, port: int = NODE_PORT) -> None:
        self.port = port
        self.local = LocalAgentStarter()

    def start(self, host: str, agent_args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        if is_local_host(host):
            return self.local.start(host, agent_args, env)
        argv = [sys.executable, "-m", "elastrain.launcher.node_client", "--host", host]
        argv += ["--port", str(self.port), "--", *agent_args]
        return subprocess.Popen(argv, env=env, start_new_session=True)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(prog="elastrain-node-client")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, default=NODE_PORT)
    parser.add_argument("agent_args", nargs=argparse.REMAINDER)
    argv = list(sys.argv[1:] if argv is None else argv)
    split = argv.index("--") if "--" in argv else len(argv)  # the agent's argv (and command) stay untouched
    args = parser.parse_args(argv[:split])
    agent_args = argv[split + 1 :] or args.agent_args
    return run_remote(args.host, args.port, agent_args)


if __name__ == "__main__":
    sys.exit(main())
