"""`elastrain run` inside a Slurm allocation: the allocation's nodes and slots, agents started with srun.

``sbatch -N 4 --wrap "elastrain run python train.py"`` runs the launcher (coordinator) in the batch
step on the first node; every node of the allocation gets one agent, started as a job step of its
own (``srun --nodes=1 --ntasks=1 --nodelist=NODE --overlap``). The agent runs under
`SlurmAgent`: a SIGTERM to its step (``scancel --signal=TERM JOB.STEP``, preemption, a time limit)
makes its workers leave gracefully at their next commit, then the agent leaves too, so the job
shrinks instead of failing. The hosts follow the job's NodeList (`elastrain.launcher.hosts.SlurmHosts`);
with ``--max-np`` the launcher grows its own allocation onto idle nodes of its partition, once
(`elastrain.launcher.slurm_grow`), and the job grows onto them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping

from elastrain.agent.agent import Agent, AgentConfig
from elastrain.errors import ConfigError
from elastrain.launcher.agents import AgentStarter
from elastrain.procutil import Spawner, die_with_parent

log = logging.getLogger("elastrain.slurm")

# How long the workers of a signalled agent step may take to reach their next commit and leave.
LEAVE_BOUND_S = 60.0

_RANGE_RE = re.compile(r"^(\d+)(?:-(\d+))?$")
_REPEAT_RE = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")

# srun reads these as defaults for its own flags; the batch step's values describe the whole job.
_SRUN_INPUT_VARS = ("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_NTASKS_PER_NODE", "SLURM_NNODES", "SLURM_NODELIST")


def _split_top_level(expr: str) -> list[str]:
    """Split on commas outside brackets: ``n[1-2,4],m1`` -> ``['n[1-2,4]', 'm1']``."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ConfigError(f"hostlist {expr!r}: unbalanced ']'")
        elif ch == "," and depth == 0:
            parts.append(expr[start:i])
            start = i + 1
    if depth != 0:
        raise ConfigError(f"hostlist {expr!r}: unbalanced '['")
    parts.append(expr[start:])
    return [p.strip() for p in parts if p.strip()]


def _expand_ranges(ranges: str, expr: str) -> list[str]:
    """``1-3,07`` -> ``['1', '2', '3', '07']`` (zero padding kept, as Slurm does)."""
    values = []
    for item in ranges.split(","):
        match = _RANGE_RE.match(item.strip())
        if match is None:
            raise ConfigError(f"hostlist {expr!r}: bad range {item!r}")
        lo_text, hi_text = match.group(1), match.group(2) or match.group(1)
        lo, hi = int(lo_text), int(hi_text)
        if hi < lo:
            raise ConfigError(f"hostlist {expr!r}: range {item!r} goes backwards")
        width = len(lo_text) if lo_text.startswith("0") or len(lo_text) == len(hi_text) else 0
        values += [str(v).zfill(width) for v in range(lo, hi + 1)]
    return values


def _expand_one(name: str, expr: str) -> list[str]:
    """Expand every bracket of one name: ``r[1-2]n[1-2]`` -> r1n1, r1n2, r2n1, r2n2."""
    open_at = name.find("[")
    if open_at < 0:
        if "]" in name:
            raise ConfigError(f"hostlist {expr!r}: unbalanced ']'")
        return [name]
    close_at = name.find("]", open_at)
    if close_at < 0:
        raise ConfigError(f"hostlist {expr!r}: unbalanced '['")
    head, ranges, tail = name[:open_at], name[open_at + 1 : close_at], name[close_at + 1 :]
    return [head + v + rest for v in _expand_ranges(ranges, expr) for rest in _expand_one(tail, expr)]


def expand_hostlist(expr: str) -> list[str]:
    """Expand a Slurm hostlist expression (``n[1-3,5],gpu[01-02]``) into node names, in order.

    Duplicates are dropped (first occurrence kept), as ``scontrol show hostnames`` does.
    """
    names: list[str] = []
    for part in _split_top_level(expr.strip()):
        for name in _expand_one(part, expr):
            if name not in names:
                names.append(name)
    return names


def parse_tasks_per_node(value: str, nodes: int) -> list[int]:
    """``2(x3),1`` (SLURM_TASKS_PER_NODE) -> ``[2, 2, 2, 1]``; must describe exactly `nodes` nodes."""
    counts: list[int] = []
    for item in value.split(","):
        match = _REPEAT_RE.match(item.strip())
        if match is None:
            raise ConfigError(f"SLURM_TASKS_PER_NODE={value!r}: cannot read {item!r}")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    if len(counts) != nodes:
        raise ConfigError(f"SLURM_TASKS_PER_NODE={value!r} describes {len(counts)} nodes, not {nodes}")
    return counts


def allocation_slots(env: Mapping[str, str], nproc_per_node: int | None = None) -> dict[str, int]:
    """Node -> worker slots of the allocation the environment describes (in nodelist order).

    Slots per node, first found: `nproc_per_node` (``--nproc-per-node``), SLURM_NTASKS_PER_NODE,
    SLURM_TASKS_PER_NODE, SLURM_NTASKS spread over the nodes, else 1.
    """
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodelist:
        raise ConfigError("SLURM_JOB_NODELIST is not set: run inside a Slurm allocation (sbatch, salloc)")
    nodes = expand_hostlist(nodelist)
    if not nodes:
        raise ConfigError(f"SLURM_JOB_NODELIST={nodelist!r} names no nodes")
    per_node = nproc_per_node or _int(env.get("SLURM_NTASKS_PER_NODE"))
    if per_node:
        counts = [per_node] * len(nodes)
    elif env.get("SLURM_TASKS_PER_NODE"):
        counts = parse_tasks_per_node(env["SLURM_TASKS_PER_NODE"], len(nodes))
    elif total := _int(env.get("SLURM_NTASKS") or env.get("SLURM_NPROCS")):
        base, extra = divmod(total, len(nodes))
        counts = [base + (1 if i < extra else 0) for i in range(len(nodes))]
    else:
        counts = [1] * len(nodes)
    return {node: count for node, count in zip(nodes, counts) if count > 0}


def _int(value: str | None) -> int | None:
    """The leading integer of a Slurm variable (``2(x3)`` -> 2), None when absent or unreadable."""
    match = re.match(r"\s*(\d+)", value or "")
    return int(match.group(1)) if match else None


def in_allocation(env: Mapping[str, str] | None = None) -> bool:
    """True inside a Slurm job (sbatch script, salloc shell, srun step)."""
    env = os.environ if env is None else env
    return bool(env.get("SLURM_JOB_ID") and (env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")))


def node_address(node: str) -> str | None:
    """The NodeAddr Slurm reaches `node` at (``scontrol show node``), as an IP; None if unknown."""
    try:
        out = subprocess.run(
            ["scontrol", "show", "node", "--oneliner", node],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"\bNodeAddr=(\S+)", out)
    if match is None:
        return None
    try:
        return socket.gethostbyname(match.group(1))
    except OSError:
        return None


def coordinator_host(requested: str, env: Mapping[str, str] | None = None) -> str:
    """The address the coordinator listens on so that every node of the allocation reaches it.

    An explicit ``--coordinator-host`` other than the loopback default wins; then
    ELASTRAIN_COORDINATOR_HOST; then the NodeAddr Slurm knows this node by (127.0.0.1 on a
    single-machine test cluster); then this machine's resolved host name.
    """
    env = os.environ if env is None else env
    if requested not in ("", "127.0.0.1", "localhost"):
        return requested
    if env.get("ELASTRAIN_COORDINATOR_HOST"):
        return env["ELASTRAIN_COORDINATOR_HOST"]
    node = env.get("SLURMD_NODENAME")
    address = node_address(node) if node else None
    if address is None:
        try:
            address = socket.gethostbyname(socket.gethostname())
        except OSError:
            address = "127.0.0.1"
    return "127.0.0.1" if address.startswith("127.") else address


def srun_command(host: str, agent_args: list[str], python: str = sys.executable) -> list[str]:
    """The srun line that starts the agent of `host` as a one-task job step on that node."""
    return [
        "srun",
        "--nodes=1",
        "--ntasks=1",
        "--ntasks-per-node=1",
        f"--nodelist={host}",
        "--overlap",  # share the job's CPUs, memory and GPUs with the batch step and other agents
        "--kill-on-bad-exit=0",
        "--export=ALL",  # the job token, the checkpoint and ledger settings travel in the environment
        "--input=none",
        f"--job-name=elastrain-agent-{host}",
        python,
        "-m",
        "elastrain.launcher.slurm",
        *agent_args,
    ]


class SlurmAgentStarter(AgentStarter):
    """Starts each node's agent with srun, from inside the allocation (the launcher's job)."""

    def __init__(self, python: str = sys.executable) -> None:
        if shutil.which("srun") is None:
            raise ConfigError("srun is not on PATH: run inside a Slurm allocation with the Slurm commands")
        self.python = python
        self._spawner = Spawner()
        self._lock = threading.Lock()
        self.steps: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, host: str, agent_args: list[str], env: dict[str, str]) -> subprocess.Popen[bytes] | None:
        step_env = {k: v for k, v in env.items() if k not in _SRUN_INPUT_VARS}
        argv = srun_command(host, agent_args, self.python)
        # SIGTERM when the launcher dies: srun forwards it to the agent, whose workers then leave.
        proc: subprocess.Popen[bytes] = self._spawner.call(  # type: ignore[assignment]
            lambda: subprocess.Popen(
                argv, env=step_env, stdin=subprocess.DEVNULL, preexec_fn=die_with_parent(signal.SIGTERM)
            )
        )
        with self._lock:
            self.steps[host] = proc
        threading.Thread(target=self._report_exit, args=(host, proc), daemon=True).start()
        return proc

    @staticmethod
    def _report_exit(host: str, proc: subprocess.Popen[bytes]) -> None:
        """Say so when an agent step fails (srun could not start it, the node died)."""
        code = proc.wait()
        if code != 0:
            print(f"elastrain: the agent step on {host} (srun) ended with code {code}", file=sys.stderr)


class SlurmAgent(Agent):
    """The agent of one Slurm job step: on SIGTERM its workers leave, then it leaves the job too.

    A plain agent forwards SIGTERM to its workers and stays; under Slurm the signal means the step
    is going away (KillWait later it is killed), so once the workers have left this agent takes no
    new workers and disconnects: the coordinator forgets the node and the job shrinks.
    """

    def __init__(self, config: AgentConfig) -> None:
        # Set before connecting: the coordinator may push "spawn" as soon as the hello is answered,
        # on the connection's reader thread, before `Agent.__init__` has even stored `self.client`.
        self.draining = threading.Event()
        self._connected = threading.Event()
        super().__init__(config)
        self._connected.set()

    def terminate_all(self, sig: signal.Signals) -> None:
        super().terminate_all(sig)
        if sig == signal.SIGTERM and not self._exit_requested.is_set() and not self.draining.is_set():
            self.draining.set()
            print(f"elastrain agent {self.config.host}: SIGTERM, workers leave", file=sys.stderr, flush=True)
            threading.Thread(target=self._leave_when_idle, name="elastrain-drain", daemon=True).start()

    def _spawn(self, worker_id: str, local_rank: int) -> None:
        self._connected.wait(30)  # `self.client` exists (see __init__)
        if self.draining.is_set():
            log.warning("%s is leaving (SIGTERM): not starting worker %s", self.config.host, worker_id)
            return
        super()._spawn(worker_id, local_rank)

    def _leave_when_idle(self) -> None:
        """Leave once the workers have left; kill those still there after `LEAVE_BOUND_S`: a step
        that Slurm signalled (``scancel --signal``) is never killed by Slurm, and its job would stay
        queued for as long as a worker that does not leave (hung in C code, say) keeps it."""
        deadline = time.monotonic() + LEAVE_BOUND_S
        while self.procs and not self._exit_requested.is_set() and time.monotonic() < deadline:
            self._exit_requested.wait(0.05)
        if self.procs and not self._exit_requested.is_set():
            print(
                f"elastrain agent {self.config.host}: workers still running {LEAVE_BOUND_S:.0f}s after "
                "SIGTERM: killed",
                file=sys.stderr,
                flush=True,
            )
            self.terminate_all(signal.SIGKILL)
        self._exit_requested.set()


def main(argv: list[str] | None = None) -> int:
    """``python -m elastrain.launcher.slurm AGENT-ARGS``: `elastrain agent` as a Slurm job step."""
    import elastrain.agent.agent as agent_module

    # The agent's own command line, with this class in place of `Agent` (this process only).
    agent_module.Agent = SlurmAgent  # type: ignore[misc]
    return agent_module.main(argv)


if __name__ == "__main__":
    sys.exit(main())
