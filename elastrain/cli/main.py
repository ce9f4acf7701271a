"""`elastrain`: run, agent, hosts, demo. Bad input is one line on stderr and exit code 2."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import NoReturn

from elastrain.errors import ElastrainError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


def _add_run(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="launch an elastic training job (horovodrun/torchrun-style flags)")
    p.add_argument("-np", "--num-proc", dest="np", type=int, help="number of workers to start")
    p.add_argument("--min-np", type=int, help="fewest workers the job may run with")
    p.add_argument("--max-np", type=int, help="most workers the job may grow to")
    p.add_argument("-H", "--hosts", dest="host_list", help="static hosts: host1:slots,host2:slots")
    p.add_argument("--hostfile", help="hostfile ('host slots=N' lines); watched: edits resize the job")
    p.add_argument("--host-discovery-script", help="prints 'host:slots' lines; polled for changes")
    p.add_argument("--nproc-per-node", "--nproc_per_node", type=int, help="slots per host (torchrun users)")
    p.add_argument("--ledger", type=Path, help="directory for the exactly-once ledger and generation events")
    p.add_argument("--coordinator-host", default="127.0.0.1", help="address the coordinator listens on")
    p.add_argument("--coordinator-port", type=int, default=0, help="port for the coordinator (0: any)")
    p.add_argument("--join-grace", type=float, default=5.0, help="seconds to wait for more new workers")
    p.add_argument(
        "--heartbeat-timeout", type=float, default=30.0, help="seconds before a silent worker is out"
    )
    p.add_argument("--elastic-timeout", type=float, default=60.0, help="seconds allowed below --min-np")
    p.add_argument(
        "--start-timeout", type=float, default=120.0, help="seconds for the first workers to start"
    )
    p.add_argument("--max-restarts", type=int, default=3, help="respawns allowed to get back to --min-np")
    p.add_argument(
        "--mode",
        choices=["auto", "native", "restart"],
        default="auto",
        help="native: the script uses elastrain (live resize); restart: a torchrun-style script "
        "restarted on each change; auto: native if the script imports elastrain",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log the coordinator's decisions")
    p.add_argument("command", nargs=argparse.REMAINDER, help="the training command, e.g. python train.py")


def _cmd_run(args: argparse.Namespace) -> int:
    from elastrain.launcher.hosts import make_host_source
    from elastrain.launcher.run import LaunchConfig, Launcher, check_command, uses_elastrain

    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    check_command(command)
    if args.max_restarts < 0:
        raise ElastrainError("--max-restarts must be >= 0")
    source = make_host_source(
        args.host_list, args.hostfile, args.host_discovery_script, args.nproc_per_node, args.np
    )
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
    )
    return Launcher(config).run()


def _add_hosts(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("hosts", help="print a hostfile as 'host:slots' lines (for --host-discovery-script)")
    p.add_argument("--discovery", metavar="HOSTFILE", required=True, help="the hostfile to read")


def _cmd_hosts(args: argparse.Namespace) -> int:
    from elastrain.hostfile import read_hostfile, render_discovery

    sys.stdout.write(render_discovery(read_hostfile(args.discovery)))
    return 0


def _add_demo(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="run the elastic demo: 2 -> 4 workers, kill one, back to 2")
    p.add_argument("--json", type=Path, help="write the report as JSON here")
    p.add_argument("--epochs", type=int, default=8, help="training epochs")
    p.add_argument("--workdir", type=Path, help="where the hostfile and ledger go (default: a temp dir)")


def _cmd_demo(args: argparse.Namespace) -> int:
    from elastrain.demo import run_demo

    return run_demo(json_path=args.json, epochs=args.epochs, workdir=args.workdir)


def build_parser() -> argparse.ArgumentParser:
    """The full command-line parser."""
    parser = _Parser(prog="elastrain", description="Elastic distributed training.")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    _add_run(sub)
    sub.add_parser(
        "agent", help="join a job's coordinator as one host (see `elastrain agent --help`)", add_help=False
    )
    _add_hosts(sub)
    _add_demo(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `elastrain` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["agent"]:
        from elastrain.agent.agent import main as agent_main

        return agent_main(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="elastrain: %(message)s",
    )
    handlers = {"run": _cmd_run, "hosts": _cmd_hosts, "demo": _cmd_demo}
    try:
        return handlers[args.cmd](args)
    except ElastrainError as exc:
        print(f"elastrain {args.cmd}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
