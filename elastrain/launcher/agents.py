"""How `elastrain run` starts the agent of a host: directly for local hosts, by another mechanism elsewhere.

`AgentStarter` is the boundary (a Slurm allocation starts agents with ``srun``, see
`elastrain.launcher.slurm` when present); `LocalAgentStarter` starts processes on this machine and
prints the command to run by hand for hosts it cannot reach.
"""

from __future__ import annotations

import abc
import shlex
import socket
import subprocess
import sys


def is_local_host(host: str) -> bool:
    """True for loopback addresses and this machine's own names, where agents are started directly."""
    if host in ("localhost", socket.gethostname(), socket.getfqdn()) or host.startswith("127."):
        return True
    try:
        return socket.gethostbyname(host).startswith("127.")
    except OSError:
        return False


class AgentStarter(abc.ABC):
    """Starts one agent process for `host`; returns it when this machine owns the process."""

    @abc.abstractmethod
    def start(self, host: str, agent_args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        """Start ``elastrain agent <agent_args>`` for `host` with `env` (the job token included)."""


class LocalAgentStarter(AgentStarter):
    """Local hosts: a child process (dies with the launcher). Other hosts: print the command to run there.

    With a `wrapper` (``--agent-wrapper``, e.g. ``ip netns exec ns-{host}``) the agent of a non-local
    host is started through it, with ``{host}`` replaced; the wrapper must keep the environment.
    """

    def __init__(self, wrapper: str = "") -> None:
        self.wrapper = wrapper

    def start(self, host: str, agent_args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        prefix: list[str] = []
        if self.wrapper and not is_local_host(host):
            prefix = [part.replace("{host}", host) for part in shlex.split(self.wrapper)]
        elif not is_local_host(host):
            token = env["ELASTRAIN_JOB_TOKEN"]
            command = f"ELASTRAIN_JOB_TOKEN={token} elastrain agent {shlex.join(agent_args)}"
            print(f"elastrain: start the agent for {host} there: {command}", file=sys.stderr)
            return None
        argv = [*prefix, sys.executable, "-m", "elastrain.agent.agent", *agent_args]
        # Agents outlive a crashed launcher on purpose: they wait (bounded) for a replacement (--rejoin).
        return subprocess.Popen(argv, env=env, start_new_session=True)
