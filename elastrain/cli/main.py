"""`elastrain`: run, agent, hosts, demo. Bad input is one line on stderr and exit code 2; a request the
server refuses for several fields adds one indented line per field; work that runs past its
``--timeout`` is one line too (what is still pending, how to check it) and exit code 1."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path
from typing import NoReturn

from elastrain.cli.chaos_cmd import add_chaos_parser, cmd_chaos
from elastrain.cli.image_cmd import add_image_parser, cmd_image
from elastrain.cli.run_argv import parse_run_args
from elastrain.cli.run_cmd import add_run_parser, cmd_run
from elastrain.errors import ElastrainError


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage dump)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


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
    p.add_argument(
        "--cluster",
        action="store_true",
        help="the seed's flow through the control plane: server, 2-container cluster, job, scale 2 -> 4, "
        "kill -9 a worker, scale back, delete",
    )


def _cmd_demo(args: argparse.Namespace) -> int:
    if args.cluster:
        from elastrain.demo_cluster import run_cluster_demo

        return run_cluster_demo(json_path=args.json, epochs=min(args.epochs, 6), workdir=args.workdir)
    from elastrain.demo import run_demo

    return run_demo(json_path=args.json, epochs=args.epochs, workdir=args.workdir)


def _error_lines(exc: ElastrainError) -> list[str]:
    """The message; for a refusal naming several fields, a summary then ``  FIELD: message`` per field
    (the server's one-line detail holds them all, so it is not printed twice)."""
    from elastrain.client import ClientError

    if not isinstance(exc, ClientError) or len(exc.errors) < 2:
        return [str(exc)]
    fields = ", ".join(dict.fromkeys(line.split(":")[0] for line in exc.field_lines()))
    head = f"invalid request: {len(exc.errors)} problems ({fields}) (HTTP {exc.status})"
    return [head, *(f"  {line}" for line in exc.field_lines())]


def build_parser() -> argparse.ArgumentParser:
    """The full command-line parser."""
    parser = _Parser(prog="elastrain", description="Elastic distributed training.")
    sub = parser.add_subparsers(dest="cmd", required=True, parser_class=_Parser)
    add_run_parser(sub)
    sub.add_parser(
        "agent", help="join a job's coordinator as one host (see `elastrain agent --help`)", add_help=False
    )
    _add_hosts(sub)
    _add_demo(sub)
    add_chaos_parser(sub)
    add_image_parser(sub)
    from elastrain.cli.cluster import add_control_plane_commands

    add_control_plane_commands(sub)  # server, cluster, user, job
    from elastrain.scheduler.cli import add_simulate_command

    add_simulate_command(sub)  # simulate (scheduler policies on a trace)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `elastrain` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["agent"]:
        from elastrain.agent.agent import main as agent_main

        return agent_main(argv[1:])
    parser = build_parser()
    # `run`: the training command is set aside before argparse sees elastrain's options
    args = parse_run_args(parser, argv[1:]) if argv[:1] == ["run"] else parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if getattr(args, "verbose", False) else logging.WARNING,
        format="elastrain: %(message)s",
    )
    from elastrain.cli.cluster import control_plane_handlers
    from elastrain.scheduler.cli import cmd_simulate

    handlers = {
        "run": cmd_run,
        "chaos": cmd_chaos,
        "image": cmd_image,
        "hosts": _cmd_hosts,
        "demo": _cmd_demo,
        **control_plane_handlers(),
    }
    handlers["simulate"] = cmd_simulate
    from elastrain.cli.progress import TimedOut

    try:
        return handlers[args.cmd](args)
    except TimedOut as exc:  # not bad input: the work goes on (or can be resumed) without us
        print(f"elastrain {args.cmd}: error: {exc}", file=sys.stderr)
        return 1
    except ElastrainError as exc:
        for line in _error_lines(exc):  # a request refused for several fields: one line each
            print(f"elastrain {args.cmd}: error: {line}" if line[:1] != " " else line, file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
