"""`elastrain run`: its flags (horovodrun's and torchrun's spellings), their checks, and the launch.

How its argv is split (everything after the training command reaches the script) and how torchrun's
spellings become elastrain's: `elastrain.cli.run_argv`. Where the two launchers differ, elastrain
keeps horovodrun's meaning: ``-np``/``--min-np``/``--max-np`` count workers (processes), not hosts, and
cannot be combined with ``--nnodes``; ``--max-restarts`` defaults to 3 (torchrun: 0) and counts, in
restart mode, the failures of each worker slot (torchrun: of each node's worker group; a membership
change is not a failure in either).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from elastrain.agent.noded import SECRET_ENV
from elastrain.cli.run_argv import size_from_nnodes, torchrun_flags, training_command
from elastrain.contracts.env import WorkerEnv
from elastrain.errors import ElastrainError


def add_run_parser(sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Register `elastrain run`; returns its parser (`run_argv.parse_run_args` splits its argv)."""
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
    p.add_argument(
        "--coordinator-port",
        type=int,
        default=None,
        help="port for the coordinator (0: any; default: ELASTRAIN_COORDINATOR_PORT, which the platform sets "
        "for a submitted job so that a replacement launcher listens on it again, else 0)",
    )
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
    p.add_argument(
        "--tensorboard-dir",
        type=Path,
        metavar="DIR",
        help="write TensorBoard scalars (loss, samples/s, world size, pause per resize, steps lost) under "
        "DIR (default: $ELASTRAIN_TENSORBOARD_DIR, the job's tensorboard_dir)",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the coordinator's decisions")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")
    return p


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
        env[WorkerEnv.CHECKPOINT_DIR] = str(args.checkpoint_dir.absolute())  # keep container links
        env[WorkerEnv.CHECKPOINT_EVERY] = str(args.checkpoint_every or 100)
        env[WorkerEnv.CHECKPOINT_KEEP] = str(args.checkpoint_keep)
        if args.checkpoint_interval:
            env[WorkerEnv.CHECKPOINT_INTERVAL] = str(args.checkpoint_interval)
    resume = resolve_resume(args.resume, args.checkpoint_dir)
    if resume is not None:
        env[WorkerEnv.RESUME_FROM] = str(resume.resolve())
        print(f"elastrain: will resume from {resume}", file=sys.stderr)
    return env


COORDINATOR_PORT_ENV = "ELASTRAIN_COORDINATOR_PORT"


def port_from_env(value: str) -> int:
    """`--coordinator-port`'s default: ELASTRAIN_COORDINATOR_PORT (set by the platform for a submitted
    job), else 0 (any port)."""
    if not value.strip():
        return 0
    try:
        return int(value)
    except ValueError:
        raise ElastrainError(
            f"{COORDINATOR_PORT_ENV}={value!r} is not a port number; unset it or give 1..65534"
        ) from None


def cmd_run(args: argparse.Namespace) -> int:
    """Run `elastrain run` with parsed flags; returns the exit code."""
    from elastrain.launcher.agents import AgentStarter
    from elastrain.launcher.attach import OutputTee, attach, record_exit
    from elastrain.launcher.hosts import SlurmHosts, make_host_source
    from elastrain.launcher.mode import uses_elastrain
    from elastrain.launcher.run import LaunchConfig, Launcher, check_command, check_sizes
    from elastrain.launcher.tensorboard import TENSORBOARD_DIR_ENV, check_tensorboard_dir

    torchrun_flags(args)  # flag mistakes first: they need no file system
    if args.coordinator_port is None:
        args.coordinator_port = port_from_env(os.environ.get(COORDINATOR_PORT_ENV, ""))
    check_sizes(args.np, args.min_np, args.max_np)
    tensorboard_flag = "--tensorboard-dir"
    if args.tensorboard_dir is None and os.environ.get(TENSORBOARD_DIR_ENV):
        args.tensorboard_dir = Path(os.environ[TENSORBOARD_DIR_ENV])
        tensorboard_flag = f"the job's tensorboard_dir ({TENSORBOARD_DIR_ENV})"
    in_container(args)
    command = training_command(args)
    check_command(command)
    tensorboard_dir = None
    if args.tensorboard_dir is not None:
        tensorboard_dir = check_tensorboard_dir(args.tensorboard_dir, tensorboard_flag)
    if args.max_restarts < 0:
        raise ElastrainError(f"--max-restarts must be >= 0, got {args.max_restarts}")
    if not 0 <= args.coordinator_port < 65535:
        raise ElastrainError(f"--coordinator-port must be 0 (any) or 1..65534, got {args.coordinator_port}")
    env = checkpoint_env(args)
    if args.rdzv_id:
        env["ELASTRAIN_RDZV_ID"] = args.rdzv_id  # restart mode: the scripts' TORCHELASTIC_RUN_ID
    source = make_host_source(
        args.host_list,
        args.hostfile,
        args.host_discovery_script,
        args.nproc_per_node,
        args.np,
        args.slurm,
        max_np=args.max_np,
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
        tensorboard_dir=tensorboard_dir,
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
    for name in ("ledger", "checkpoint_dir", "tensorboard_dir"):
        if getattr(args, name) is not None:
            setattr(args, name, Path(container_path(str(getattr(args, name)))))
    if isinstance(args.resume, str) and args.resume.startswith("/"):
        args.resume = container_path(args.resume)
