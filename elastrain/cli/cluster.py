"""`elastrain server | cluster | user`: the control-plane commands (a thin layer over `elastrain.client`).

Every command reads ``ELASTRAIN_URL`` and ``ELASTRAIN_TOKEN`` (``--url``/``--token-file`` override;
``--token`` works too but shows the token in ``ps``). Errors are `ElastrainError`s, which
`elastrain.cli.main` prints as one line with a non-zero exit. The flow::

    elastrain server --data-dir ~/.elastrain --gpus 8 &          # prints the URL and the token's file
    export ELASTRAIN_URL=http://127.0.0.1:8080 ELASTRAIN_TOKEN=$(cat ~/.elastrain/admin-token)
    elastrain cluster create tthvd --framework horovod --containers 2 --gpus-per-container 1 \
        --shm 1Gi --mount ./examples:/examples --wait
    elastrain cluster get tthvd                                   # -o json|yaml for scripts, -w to watch
    elastrain cluster describe tthvd                              # spec, containers, hostfile, events, jobs
    elastrain cluster hostfile tthvd
    elastrain cluster exec tthvd -- elastrain run -np 1 --hostfile /etc/mpi/hostfile \
        python /examples/mnist_elastic.py
    elastrain job submit tthvd -- elastrain run -v --min-np 1 --max-np 4 --hostfile /etc/mpi/hostfile \
        python /examples/mnist_elastic.py --epochs 20
    elastrain cluster scale tthvd --containers 5                  # the job grows into the new workers
    elastrain job logs -f 1; elastrain job get 1; elastrain job list
    elastrain cluster delete tthvd                                # stops every process of the cluster
    elastrain user create alice                                   # admin: prints alice's token
    elastrain user token create --expires-in-days 90              # more: elastrain.cli.user_cmd
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from elastrain.cli.output import OutputFormat, add_output_flag, print_data
from elastrain.cli.progress import StatusLine
from elastrain.cli.storage_cmd import MOUNT_HELP, resolve_mount
from elastrain.cli.table import CLUSTER_HEADER, cluster_row, format_table
from elastrain.cli.watch import (
    DEFAULT_WAIT_S,
    add_wait_flags,
    add_watch_flags,
    all_running,
    check_timeout_flag,
    wait_for_cluster,
    watch_clusters,
)
from elastrain.errors import ConfigError

if TYPE_CHECKING:
    from elastrain.client import Client, ClusterInfo

CONTROL_PLANE_COMMANDS = ("server", "cluster", "user", "job", "storage")


TOKEN_IN_ARGV_WARNING = (
    "elastrain: warning: --token shows the token to every user of this machine (ps); "
    "use ELASTRAIN_TOKEN or --token-file FILE"
)


class _TokenFlag(argparse.Action):
    """``--token TOKEN``: still works, with a warning that a command line is public."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        print(TOKEN_IN_ARGV_WARNING, file=sys.stderr, flush=True)
        setattr(namespace, self.dest, values)


class _TokenFileFlag(argparse.Action):
    """``--token-file FILE``: the token is the file's first line (kept out of argv)."""

    def __call__(
        self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any, option: Any = None
    ) -> None:
        try:
            lines = Path(values).expanduser().read_text().strip().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            parser.error(f"--token-file {values}: {getattr(exc, 'strerror', None) or exc}")
        if not lines or not lines[0].strip():
            parser.error(f"--token-file {values} is empty")
        namespace.token = lines[0].strip()


def _connection_flags() -> argparse.ArgumentParser:
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument("--url", help="control plane URL (default: $ELASTRAIN_URL or http://127.0.0.1:8080)")
    secret = parent.add_mutually_exclusive_group()
    secret.add_argument(
        "--token-file",
        action=_TokenFileFlag,
        metavar="FILE",
        help="read the API token from FILE (default: $ELASTRAIN_TOKEN)",
    )
    secret.add_argument(
        "--token",
        action=_TokenFlag,
        help="API token (visible in ps: prefer $ELASTRAIN_TOKEN or --token-file)",
    )
    parent.set_defaults(token=None)
    return parent


def add_control_plane_commands(sub: argparse._SubParsersAction) -> None:
    """Register `server`, `cluster`, `user`, `job` and `storage` on the top-level parser."""
    from elastrain.cli.job import add_job_parser
    from elastrain.cli.storage_cmd import add_storage_parser
    from elastrain.cli.user_cmd import add_user_parser
    from elastrain.server.main import add_server_parser

    add_server_parser(sub)
    _add_scheduler_flag(sub.choices["server"])
    conn = _connection_flags()
    cluster = sub.add_parser("cluster", help="create, inspect, scale, exec into and delete training clusters")
    csub = cluster.add_subparsers(dest="action", required=True, parser_class=type(cluster))
    p = csub.add_parser("create", parents=[conn], help="create a cluster (one launcher + workers)")
    p.add_argument("name", help="DNS-label name, e.g. tthvd")
    p.add_argument("--framework", default="horovod", help="horovod, deepspeed, megatron, pytorch or slurm")
    p.add_argument("--containers", type=int, default=2, help="containers including the launcher (>= 2)")
    p.add_argument("--gpus-per-container", type=int, default=0, help="GPUs for each container")
    p.add_argument("--shm", default="64Mi", help="shared memory per container, e.g. 1Gi")
    p.add_argument("--mount", action="append", default=[], metavar="SRC:DST", help=MOUNT_HELP)
    p.add_argument(
        "--image", default="", help="container image (`elastrain image list`; default: the framework's image)"
    )
    p.add_argument("--memory", default="", help="memory limit per container, e.g. 4Gi (default: none)")
    p.add_argument("--cpus", type=float, default=0.0, help="CPU limit per container in cores (default: none)")
    p.add_argument("--restart-policy", default="Always", choices=["Always", "Never"])
    p.add_argument(
        "--min-containers",
        type=int,
        help="elastic: fewest containers incl. the launcher (default: 2)",
    )
    p.add_argument(
        "--max-containers",
        type=int,
        help="elastic: most containers incl. the launcher (default: --containers)",
    )
    p.add_argument("--priority", type=int, default=0, help="higher is scheduled first and shrunk last")
    p.add_argument(
        "--idle-release-after",
        type=int,
        default=None,
        metavar="S",
        help="release the workers after S seconds without a running job (0: never; default: the server's)",
    )
    p.add_argument(
        "--gpu-type",
        metavar="MODEL",
        help="only GPUs of this model, as the inventory names it (e.g. 'NVIDIA H200'; default: any)",
    )
    add_wait_flags(p, "wait until every container is Running (a live status line on stderr)")
    p = csub.add_parser("get", parents=[conn], help="show a cluster and its containers")
    p.add_argument("name")
    add_output_flag(p)
    add_watch_flags(p, "print a new row whenever the cluster changes, until Ctrl-C or --timeout")
    p = csub.add_parser("list", parents=[conn], help="list your clusters")
    add_output_flag(p)
    add_watch_flags(p, "print a new row whenever a cluster changes, until Ctrl-C or --timeout")
    p = csub.add_parser(
        "describe", parents=[conn], help="a cluster in detail: spec, containers, hostfile, events, jobs"
    )
    p.add_argument("name")
    p = csub.add_parser("hostfile", parents=[conn], help="print the cluster's hostfile")
    p.add_argument("name")
    p = csub.add_parser("scale", parents=[conn], help="change the number of containers (launcher included)")
    p.add_argument("name")
    p.add_argument("--containers", type=int, required=True)
    add_wait_flags(p, "wait until the new size is Running (a live status line on stderr)")
    p = csub.add_parser("delete", parents=[conn], help="stop every process of the cluster and remove it")
    p.add_argument("name")
    p.add_argument("--no-wait", action="store_true", help="return without waiting for the removal")
    p = csub.add_parser("exec", parents=[conn], help="run a command in the launcher container")
    p.add_argument("name")
    p.add_argument("--container", help="run in this container instead of the launcher")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD ARGS...")
    p = csub.add_parser("events", parents=[conn], help="the cluster's audit trail")
    p.add_argument("name")
    p = csub.add_parser("logs", parents=[conn], help="a container's captured output (default: the launcher)")
    p.add_argument("name")
    p.add_argument("--container", help="container name (see cluster get)")
    add_user_parser(sub, conn)
    add_job_parser(sub, conn)
    add_storage_parser(sub, conn)


def _add_scheduler_flag(server: argparse.ArgumentParser) -> None:
    """``elastrain server --scheduler`` (kept here, next to the other control-plane commands)."""
    from elastrain.server.scheduling import SchedulerMode

    server.add_argument(
        "--scheduler",
        choices=[m.value for m in SchedulerMode],
        default=None,
        help="elastic (default): the simulator's elastic policy: a cluster follows its running job's "
        "--min-np/--max-np within its bounds, grows into idle GPUs, shrinks or is preempted for "
        "better-ranked clusters; static: clusters keep their requested size (env ELASTRAIN_SCHEDULER)",
    )
    server.add_argument(
        "--idle-release-after",
        type=int,
        default=None,
        metavar="S",
        help="release the workers of a cluster with GPUs and no running job for S seconds (its launcher "
        "stays); 0: never (env ELASTRAIN_IDLE_RELEASE_AFTER; default 600)",
    )


def control_plane_handlers() -> dict[str, Callable[[argparse.Namespace], int]]:
    """Command name -> handler, for `elastrain.cli.main`."""
    return dict.fromkeys(CONTROL_PLANE_COMMANDS, run_control_plane)


def run_control_plane(args: argparse.Namespace) -> int:
    """Dispatch one control-plane command."""
    if args.cmd == "server":
        from elastrain.server.main import run_server

        return run_server(args)  # resolves the settings (flag > env > file), --scheduler included
    if args.cmd == "job":
        from elastrain.cli.job import run_job_command

        return run_job_command(args)
    from elastrain.client import Client

    check_timeout_flag(args)
    with Client(args.url, args.token) as client:
        try:
            if args.cmd in ("user", "storage"):
                from elastrain.cli.storage_cmd import run_storage_command
                from elastrain.cli.user_cmd import run_user_command

                return (run_user_command if args.cmd == "user" else run_storage_command)(client, args)
            return _CLUSTER_ACTIONS[args.action](client, args)
        except BrokenPipeError:  # `elastrain cluster get X -o json | head`
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 0


def _create(client: Client, args: argparse.Namespace) -> int:
    cluster = client.create_cluster(
        args.name,
        framework=args.framework,
        containers=args.containers,
        gpus_per_container=args.gpus_per_container,
        shm=args.shm,
        image=args.image,
        memory=args.memory,
        cpus=args.cpus,
        mounts=[resolve_mount(m) for m in args.mount],
        restart_policy=args.restart_policy,
        min_containers=args.min_containers,
        max_containers=args.max_containers,
        priority=args.priority,
        gpu_type=args.gpu_type,
        idle_release_after=args.idle_release_after,
    )
    if args.wait:
        cluster = _wait_running(client, args.name, args.timeout)
    workers = cluster.desired_containers - 1
    print(f"cluster {cluster.name} created: 1 launcher + {workers} worker(s), state {cluster.state}")
    from elastrain.examples import first_job_command  # the portal's job box holds the same command

    low = cluster.min_containers or cluster.desired_containers
    first_job = first_job_command(low, cluster.gpus_per_container, cluster.max_containers or low)
    print(f"next, its first job: elastrain job submit {cluster.name} -- {first_job}")
    return 0


def _wait_running(client: Client, name: str, timeout: float | None) -> ClusterInfo:
    """Wait for every container with a live status line on stderr; `TimedOut` after `timeout`."""
    status = StatusLine()
    try:
        return wait_for_cluster(client, name, timeout or DEFAULT_WAIT_S, status, all_running)
    finally:
        status.close()


def _get(client: Client, args: argparse.Namespace) -> int:
    if args.watch:
        return watch_clusters(client, args.name, OutputFormat(args.output), args.timeout)
    cluster = client.get_cluster(args.name)
    if args.output != OutputFormat.TABLE.value:
        print_data(cluster.summary(), args.output)
        return 0
    print(
        f"cluster {cluster.name}: {cluster.framework}, {cluster.state}"
        f"{' (' + cluster.reason + ')' if cluster.reason else ''}, "
        f"{len(cluster.running())}/{cluster.desired_containers} containers running, "
        f"hostfile generation {cluster.hostfile_generation}"
    )
    if cluster.min_containers != cluster.max_containers or cluster.size_reason:
        print(
            f"size: {cluster.desired_containers} containers (elastic {cluster.min_containers}.."
            f"{cluster.max_containers}, priority {cluster.priority})"
            f"{': ' + cluster.size_reason if cluster.size_reason else ''}"
        )
    if cluster.gpu_type:
        print(f"gpu type: {cluster.gpu_type}")
    rows = [["NAME", "ROLE", "ADDRESS", "GPUS", "STATE", "STARTED"]]
    for c in cluster.containers:
        gpus = f"{c.gpus} ({','.join(map(str, c.gpu_ids))})" if c.gpu_ids else str(c.gpus)
        started = (c.started_at or "-")[:19].replace("T", " ")
        rows.append(
            [c.name, c.role, c.address, gpus, c.state + (f": {c.reason}" if c.reason else ""), started]
        )
    print(format_table(rows))
    print(f"run training: elastrain cluster exec {cluster.name} -- {cluster.raw.get('launch_hint', '')}")
    return 0


def _list(client: Client, args: argparse.Namespace) -> int:
    if args.watch:
        return watch_clusters(client, None, OutputFormat(args.output), args.timeout)
    clusters = client.list_clusters()
    if args.output != OutputFormat.TABLE.value:
        print_data([c.summary() for c in clusters], args.output)
        return 0
    rows = [CLUSTER_HEADER, *(cluster_row(c) for c in clusters)]
    print(format_table(rows) if clusters else "no clusters")
    return 0


def _describe(client: Client, args: argparse.Namespace) -> int:
    from elastrain.cli.describe import describe_cluster

    print(describe_cluster(client, args.name))
    return 0


def _hostfile(client: Client, args: argparse.Namespace) -> int:
    sys.stdout.write(client.hostfile(args.name))
    return 0


def _scale(client: Client, args: argparse.Namespace) -> int:
    cluster = client.scale_cluster(args.name, args.containers)
    if args.wait:
        cluster = _wait_running(client, args.name, args.timeout)
    print(f"cluster {cluster.name}: {cluster.desired_containers} containers desired, state {cluster.state}")
    return 0


def _delete(client: Client, args: argparse.Namespace) -> int:
    client.delete_cluster(args.name)
    if not args.no_wait:
        client.wait_deleted(args.name, timeout=120)
        print(f"cluster {args.name} deleted")
    else:
        print(f"cluster {args.name} is being deleted")
    return 0


def _exec(client: Client, args: argparse.Namespace) -> int:
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise ConfigError("no command given; e.g. elastrain cluster exec tthvd -- hostname")
    code = 0
    for item in client.exec(args.name, command, container=args.container):
        if isinstance(item, int):
            code = item
        else:
            sys.stdout.write(item)
            sys.stdout.flush()
    return code


def _events(client: Client, args: argparse.Namespace) -> int:
    from elastrain.server.event_text import event_text

    for event in client.events(args.name):
        print(f"{event['at'][:19].replace('T', ' ')}  {event['actor']:<13}  {event_text(event)}")
    return 0


def _logs(client: Client, args: argparse.Namespace) -> int:
    sys.stdout.write(client.container_logs(args.name, args.container))
    return 0


_CLUSTER_ACTIONS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "create": _create,
    "get": _get,
    "list": _list,
    "describe": _describe,
    "hostfile": _hostfile,
    "scale": _scale,
    "delete": _delete,
    "exec": _exec,
    "events": _events,
    "logs": _logs,
}
