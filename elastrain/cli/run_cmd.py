"""`elastrain run`: the flags (horovodrun/torchrun-compatible) and their validation.

**Where elastrain's flags end.** ``elastrain run [OPTIONS] COMMAND [ARGS...]``: elastrain's options end at
the first token that is neither one of its options (spelled in full: no abbreviations) nor that
option's value, or at ``--``. Everything from there on is the training command and reaches it
untouched, as with horovodrun and torchrun (``elastrain run -np 2 python train.py --n 5 -v`` gives
``--n 5 -v`` to train.py). An unknown option before the command is refused by name.

**torchrun's spellings.** ``--nnodes N`` / ``--nnodes MIN:MAX`` (hosts) times ``--nproc-per-node P``
(workers per host) gives the number of workers: a fixed ``N*P``, or between ``MIN*P`` and ``MAX*P``
(without ``--nproc-per-node``: the slots per host of the host list, which must then be equal; 1 on
this machine alone). ``--rdzv-endpoint HOST[:PORT]`` is where the coordinator (elastrain's rendezvous)
listens (port 29400 when left out, as torchrun); ``--rdzv-backend`` accepts ``c10d`` and ``static`` (the
coordinator plays their part) and refuses others; ``--rdzv-id`` is recorded as the scripts'
``TORCHELASTIC_RUN_ID``; ``--standalone`` is one node on this machine (``127.0.0.1``, ``--nproc-per-node``
slots, the coordinator on loopback). A command that starts with a ``.py`` file runs under ``python``
(``-m/--module`` runs ``python -m``; ``--no-python`` runs the command as given). ``--node-rank``,
``--master-addr`` and ``--master-port`` are refused: elastrain starts every host's agent itself and
picks MASTER_ADDR/MASTER_PORT for each generation.

Where the two launchers differ, elastrain keeps horovodrun's meaning: ``-np``/``--min-np``/``--max-np``
count workers (processes), not hosts, and cannot be combined with ``--nnodes``; ``--max-restarts``
defaults to 3 (torchrun: 0) and counts, in restart mode, the failures of each worker slot (torchrun:
of each node's worker group; a membership change is not a failure in either).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from elastrain.agent.noded import SECRET_ENV
from elastrain.errors import ConfigError, ElastrainError

if TYPE_CHECKING:
    from elastrain.launcher.hosts import HostSource


def add_run_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `elastrain run`; returns its parser (see `parse_run_args` for how its argv is split)."""
    p = sub.add_parser(
        "run",
        help="launch an elastic training job (horovodrun/torchrun-style flags)",
        usage="elastrain run [OPTIONS] [--] COMMAND [ARGS...]",
        description="Options end at the first token that is not one of these options or its value (or at "
        "--); the rest is the training command and reaches it untouched.",
        allow_abbrev=False,
    )
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of workers to start")
    p.add_argument("--min-np", type=int, help="fewest workers the job may run with")
    p.add_argument("--max-np", type=int, help="most workers the job may grow to")
    p.add_argument("-H", "--hosts", dest="host_list", help="static hosts: host1:slots,host2:slots")
    p.add_argument("--hostfile", help="hostfile ('host slots=N' lines); watched: edits resize the job")
    p.add_argument("--host-discovery-script", help="prints 'host:slots' lines; polled for changes")
    p.add_argument(
        "--nproc-per-node",
        "--nproc_per_node",
        metavar="N",
        help="workers (slots) per host: a number, or cpu/gpu/auto (default: the host list's slots)",
    )
    p.add_argument("--nnodes", metavar="N|MIN:MAX", help="torchrun: hosts (times --nproc-per-node: workers)")
    p.add_argument(
        "--standalone",
        action="store_true",
        help="torchrun: one node on this machine (127.0.0.1, --nproc-per-node workers, local coordinator)",
    )
    p.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        metavar="HOST[:PORT]",
        help="torchrun: where the coordinator listens",
    )
    p.add_argument(
        "--rdzv-backend", "--rdzv_backend", metavar="NAME", help="torchrun: c10d or static (the coordinator)"
    )
    p.add_argument(
        "--rdzv-id", "--rdzv_id", metavar="ID", help="torchrun: job id (the scripts' TORCHELASTIC_RUN_ID)"
    )
    for refused in (
        "--node-rank",
        "--node_rank",
        "--master-addr",
        "--master_addr",
        "--master-port",
        "--master_port",
    ):
        p.add_argument(refused, dest=f"refused_{refused[2:].replace('-', '_')}", help=argparse.SUPPRESS)
    p.add_argument(
        "-m", "--module", action="store_true", help="torchrun: the command is a module, run as python -m"
    )
    p.add_argument(
        "--no-python",
        "--no_python",
        action="store_true",
        help="torchrun: run the command as given (no python)",
    )
    p.add_argument("--slurm", action="store_true", help="hosts: this Slurm allocation (default in one)")
    p.add_argument("--ledger", type=Path, help="directory for the exactly-once ledger and generation events")
    p.add_argument("--coordinator-host", default="127.0.0.1", help="address the coordinator listens on")
    p.add_argument(
        "--agent-wrapper",
        default="",
        help="command prefix that starts the agent of a non-local host, {host} replaced, environment "
        "kept (e.g. 'ip netns exec ns-{host}'); default: print the command to run there",
    )
    p.add_argument("--coordinator-port", type=int, default=0, help="port for the coordinator (0: any)")
    p.add_argument("--join-grace", type=float, default=5.0, help="seconds to wait for more new workers")
    p.add_argument(
        "--heartbeat-timeout", type=float, default=30.0, help="seconds before a silent worker is out"
    )
    p.add_argument("--elastic-timeout", type=float, default=60.0, help="seconds allowed below --min-np")
    p.add_argument(
        "--start-timeout", type=float, default=120.0, help="seconds for the first workers to start"
    )
    p.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="native: respawns allowed to get back to --min-np; restart mode: failures each worker slot "
        "may restart after (the next one ends the job)",
    )
    p.add_argument("--checkpoint-dir", type=Path, help="durable checkpoints go here (the cluster's storage)")
    p.add_argument("--checkpoint-every", type=int, help="checkpoint every N steps (default 100)")
    p.add_argument("--checkpoint-interval", type=float, help="also checkpoint every S seconds")
    p.add_argument("--checkpoint-keep", type=int, default=3, help="how many checkpoints to keep")
    p.add_argument(
        "--resume",
        default="auto",
        help="auto: the newest valid checkpoint in --checkpoint-dir, if any; never; or a checkpoint path",
    )
    p.add_argument(
        "--mode",
        choices=["auto", "native", "restart"],
        default="auto",
        help="native: the script uses elastrain (live resize); restart: a torchrun-style script "
        "restarted on each change; auto: native if the script imports elastrain",
    )
    p.add_argument(
        "--rejoin",
        action="store_true",
        help="replace a launcher that died: adopt its running agents and workers (same --coordinator-port "
        "and ELASTRAIN_JOB_TOKEN as the first launcher)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the coordinator's decisions")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")
    return p


def split_run_argv(parser: argparse.ArgumentParser, argv: list[str]) -> tuple[list[str], list[str]]:
    """(elastrain's options, the training command): the options end at the first token that is not
    one of `parser`'s options or its value, or at ``--`` (dropped). An unknown option before the
    command is an error (one line, exit 2), not the start of the command."""
    table = parser._option_string_actions  # every spelling, long and short, of every option
    own: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            return own, argv[i + 1 :]
        if not token.startswith("-") or token == "-":
            break
        name, eq, _ = token.partition("=")
        action = table.get(token) or (table.get(name) if eq and name.startswith("--") else None)
        if action is None and len(token) > 2 and token[1] != "-" and table.get(token[:2]) is not None:
            action = table[token[:2]]  # -Hhost:2, as argparse reads a short option glued to its value
            if action.nargs == 0:
                action = None
            else:
                own.append(token)
                i += 1
                continue
        if action is None:
            parser.error(
                f"unknown option {token}; elastrain run's options go before the training command "
                f"(put the command after `--` if it starts with '-')"
            )
        own.append(token)
        i += 1
        if action.nargs != 0 and not eq and i < len(argv):
            own.append(argv[i])  # its value, whatever it looks like (-np -1 is refused by the checks)
            i += 1
    return own, argv[i:]


def _run_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and "run" in action.choices:
            return action.choices["run"]
    raise LookupError("no run subcommand")


def parse_run_args(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``elastrain run ARGV`` with the top-level `parser`: only elastrain's own options go through
    argparse; the training command is set aside first, so nothing in it is read as an option."""
    own, command = split_run_argv(_run_parser(parser), argv)
    args = parser.parse_args(["run", *own])
    args.command = command
    return args


TORCHRUN_PORT = 29400  # torchrun's port for a --rdzv-endpoint given without one


def _nnodes(spec: str) -> tuple[int, int]:
    lo_s, colon, hi_s = spec.partition(":")
    try:
        lo, hi = int(lo_s), int(hi_s if colon else lo_s)
    except ValueError:
        raise ConfigError(f"--nnodes must be N or MIN:MAX (e.g. 2 or 1:4), got {spec!r}") from None
    if lo < 1 or hi < 1:
        raise ConfigError(f"--nnodes must count at least 1 host, got {spec!r}")
    if lo > hi:
        raise ConfigError(f"--nnodes {spec}: MIN {lo} is larger than MAX {hi}; write it as {hi}:{lo}")
    return lo, hi


def _nproc_per_node(value: str | None) -> int | None:
    if value is None:
        return None
    if value in ("cpu", "auto", "gpu"):
        if value != "cpu":
            import torch

            if torch.cuda.is_available():
                return int(torch.cuda.device_count())
            if value == "gpu":
                raise ConfigError("--nproc-per-node gpu: no GPU is visible here; give a number or cpu")
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        raise ConfigError(f"--nproc-per-node must be a number (or cpu, gpu, auto), got {value!r}") from None
    if n < 1:
        raise ConfigError(f"--nproc-per-node must be at least 1, got {n}")
    return n


def _endpoint(value: str) -> tuple[str, int]:
    host, port_s = value, ""
    if value.startswith("["):  # [::1]:29400
        host, _, rest = value[1:].partition("]")
        port_s = rest[1:] if rest.startswith(":") else rest
    elif value.count(":") == 1:
        host, _, port_s = value.partition(":")
    if not host:
        raise ConfigError(f"--rdzv-endpoint {value!r} has no host; give HOST or HOST:PORT")
    if not port_s:
        return host, TORCHRUN_PORT
    if not port_s.isdigit() or not 0 < int(port_s) < 65535:
        raise ConfigError(f"--rdzv-endpoint {value!r}: the port must be a number from 1 to 65534")
    return host, int(port_s)


def torchrun_flags(args: argparse.Namespace) -> None:
    """Check torchrun's spellings and turn them into elastrain's (in place); bad ones raise ConfigError."""
    args.nnodes_range = None
    for name in ("node_rank", "master_addr", "master_port"):
        if getattr(args, f"refused_{name}") is not None:
            flag = "--" + name.replace("_", "-")
            raise ConfigError(
                f"{flag} is not used by elastrain run: it starts the agent of every host itself and picks "
                "MASTER_ADDR/MASTER_PORT for each generation; drop it (list the hosts with -H or --hostfile, "
                "the coordinator's address with --rdzv-endpoint)"
            )
    if args.rdzv_backend is not None and args.rdzv_backend not in ("c10d", "static"):
        raise ConfigError(
            f"--rdzv-backend {args.rdzv_backend} is not supported: elastrain's coordinator is the "
            "rendezvous; use c10d (or static), or drop the flag"
        )
    if args.module and args.no_python:
        raise ConfigError("--module runs python -m COMMAND; it cannot go with --no-python")
    args.nproc_per_node = _nproc_per_node(args.nproc_per_node)
    if args.rdzv_endpoint is not None:
        if args.coordinator_host != "127.0.0.1" or args.coordinator_port != 0:
            raise ConfigError(
                "give the coordinator's address once: --rdzv-endpoint or --coordinator-host/-port"
            )
        args.coordinator_host, args.coordinator_port = _endpoint(args.rdzv_endpoint)
    if args.standalone:
        clash = [
            flag
            for flag, value in (
                ("-H", args.host_list),
                ("--hostfile", args.hostfile),
                ("--host-discovery-script", args.host_discovery_script),
                ("--slurm", args.slurm),
                ("--rdzv-endpoint", args.rdzv_endpoint),
            )
            if value
        ]
        if clash:
            raise ConfigError(f"--standalone runs on this machine alone; drop {' and '.join(clash)}")
        args.coordinator_host = "127.0.0.1"
        args.host_list = f"127.0.0.1:{args.nproc_per_node or args.np or args.max_np or 1}"
    if args.nnodes is not None:
        lo, hi = _nnodes(args.nnodes)
        if args.np is not None or args.min_np is not None or args.max_np is not None:
            raise ConfigError(
                "give the job's size once: torchrun's --nnodes (hosts) or horovodrun's -np/--min-np/--max-np "
                "(workers)"
            )
        if args.standalone and hi > 1:
            raise ConfigError(f"--standalone is one node; drop --nnodes {args.nnodes} or use --nnodes 1")
        args.nnodes_range = (lo, hi)


def size_from_nnodes(args: argparse.Namespace, source: HostSource) -> None:
    """--nnodes MIN:MAX hosts -> -np or --min-np/--max-np workers (in place)."""
    from elastrain.launcher.hosts import SlurmHosts, StaticHosts

    lo, hi = args.nnodes_range
    if isinstance(source, StaticHosts):  # -H, a Slurm allocation or this machine: the hosts never change
        listed = len(source.read().hosts)
        if lo > listed:
            if isinstance(source, SlurmHosts):
                where = f"the Slurm allocation has {listed}"
            elif args.host_list:
                where = f"-H lists {listed}"
            else:
                raise ConfigError(
                    f"--nnodes {args.nnodes} needs {lo} hosts but only this machine is listed; give the "
                    "hosts with -H or --hostfile (elastrain starts every node's agent), or use --nnodes 1"
                )
            raise ConfigError(
                f"--nnodes {args.nnodes} needs {lo} hosts but {where}; add hosts or lower --nnodes"
            )
    per_node = args.nproc_per_node
    if per_node is None:
        counts = sorted({h.slots for h in source.read().hosts})
        if len(counts) > 1:
            raise ConfigError(
                f"--nnodes counts hosts, but the hosts have different slot counts ({counts}); give "
                "--nproc-per-node, or size the job in workers with -np/--min-np/--max-np"
            )
        per_node = counts[0] if counts else 1
    if lo == hi:
        args.np = lo * per_node
    else:
        args.min_np, args.max_np = lo * per_node, hi * per_node


def training_command(args: argparse.Namespace) -> list[str]:
    """The command each worker runs, torchrun-style forms included (``train.py ...``, ``-m mod ...``)."""
    command = args.command[1:] if args.command[:1] == ["--"] else list(args.command)
    if args.module and command:
        return ["python", "-m", *command]
    if command and command[0].endswith(".py") and not args.no_python:
        return ["python", *command]  # torchrun's form: the script, run by python
    return command


def checkpoint_env(args: argparse.Namespace) -> dict[str, str]:
    """Validate the checkpoint flags and turn them into the workers' environment."""
    from elastrain.runtime.checkpoint import resolve_resume

    if args.checkpoint_every is not None and args.checkpoint_every < 1:
        raise ElastrainError(f"--checkpoint-every must be >= 1, got {args.checkpoint_every}")
    if args.checkpoint_keep < 1:
        raise ElastrainError(f"--checkpoint-keep must be >= 1, got {args.checkpoint_keep}")
    env: dict[str, str] = {}
    if args.checkpoint_dir is not None:
        if args.checkpoint_dir.exists() and not args.checkpoint_dir.is_dir():
            raise ElastrainError(f"--checkpoint-dir {args.checkpoint_dir} is a file; give a directory")
        env["ELASTRAIN_CHECKPOINT_DIR"] = str(args.checkpoint_dir.absolute())  # keep container links
        env["ELASTRAIN_CHECKPOINT_EVERY"] = str(args.checkpoint_every or 100)
        env["ELASTRAIN_CHECKPOINT_KEEP"] = str(args.checkpoint_keep)
        if args.checkpoint_interval:
            env["ELASTRAIN_CHECKPOINT_INTERVAL"] = str(args.checkpoint_interval)
    resume = resolve_resume(args.resume, args.checkpoint_dir)
    if resume is not None:
        env["ELASTRAIN_RESUME_FROM"] = str(resume.resolve())
        print(f"elastrain: will resume from {resume}", file=sys.stderr)
    return env


def cmd_run(args: argparse.Namespace) -> int:
    """Run `elastrain run` with parsed flags; returns the exit code."""
    from elastrain.launcher.agents import AgentStarter
    from elastrain.launcher.attach import OutputTee, attach, record_exit
    from elastrain.launcher.hosts import SlurmHosts, make_host_source
    from elastrain.launcher.run import LaunchConfig, Launcher, check_command, check_sizes, uses_elastrain

    torchrun_flags(args)  # flag mistakes first: they need no file system
    check_sizes(args.np, args.min_np, args.max_np)
    in_container(args)
    command = training_command(args)
    check_command(command)
    if args.max_restarts < 0:
        raise ElastrainError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if not 0 <= args.coordinator_port < 65535:
        raise ElastrainError(f"--coordinator-port must be 0 (any) or 1..65534, got {args.coordinator_port}")
    env = checkpoint_env(args)
    if args.rdzv_id:
        env["ELASTRAIN_RDZV_ID"] = args.rdzv_id  # restart mode: the scripts' TORCHELASTIC_RUN_ID
    source = make_host_source(
        args.host_list, args.hostfile, args.host_discovery_script, args.nproc_per_node, args.np, args.slurm
    )
    if args.nnodes_range is not None:
        size_from_nnodes(args, source)
    starter: AgentStarter | None = None
    if args.agent_wrapper:
        from elastrain.launcher.agents import LocalAgentStarter

        starter = LocalAgentStarter(args.agent_wrapper)
    if isinstance(source, SlurmHosts):  # agents are job steps (srun); the coordinator on a routable address
        from elastrain.launcher.slurm import SlurmAgentStarter, coordinator_host

        starter, args.coordinator_host = SlurmAgentStarter(), coordinator_host(args.coordinator_host)
    elif starter is None and os.environ.get(SECRET_ENV) and not args.standalone:
        # in a container of a cluster: other containers' agents start through their node daemons,
        # and the coordinator listens on this container's address on the cluster network
        from elastrain.launcher.node_client import NodeAgentStarter
        from elastrain.launcher.slurm import coordinator_host

        starter, args.coordinator_host = NodeAgentStarter(), coordinator_host(args.coordinator_host)
    config = LaunchConfig(
        command=command,
        hosts=source,
        np=args.np,
        min_np=args.min_np,
        max_np=args.max_np,
        ledger_dir=args.ledger,
        coordinator_host=args.coordinator_host,
        coordinator_port=args.coordinator_port,
        join_grace_s=args.join_grace,
        heartbeat_timeout_s=args.heartbeat_timeout,
        elastic_timeout_s=args.elastic_timeout,
        start_timeout_s=args.start_timeout,
        max_restarts=args.max_restarts,
        restart_mode=args.mode == "restart" or (args.mode == "auto" and not uses_elastrain(command)),
        env=env,
        rejoin=args.rejoin,
    )
    typed = sys.argv[1:] if sys.argv[1:2] == ["run"] else ["run", *command]
    job = attach(["elastrain", *typed])
    if job is None:
        return Launcher(config, starter).run()
    config.env.update(job.env)
    tee = OutputTee(job.log_path)
    tee.start()
    code = 1
    try:
        code = Launcher(config, starter).run()
    finally:
        record_exit(job, code)
        tee.stop()
    return code


def in_container(args: argparse.Namespace) -> None:
    """Inside a control-plane container, read container paths (``/etc/mpi/hostfile``, mounts) as its own."""
    from elastrain.launcher.attach import container_path

    args.command = [container_path(a) for a in args.command]
    for name in ("hostfile", "host_discovery_script"):
        if getattr(args, name):
            setattr(args, name, container_path(getattr(args, name)))
    for name in ("ledger", "checkpoint_dir"):
        if getattr(args, name) is not None:
            setattr(args, name, Path(container_path(str(getattr(args, name)))))
    if isinstance(args.resume, str) and args.resume.startswith("/"):
        args.resume = container_path(args.resume)
