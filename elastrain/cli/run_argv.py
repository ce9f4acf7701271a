"""`elastrain run`'s argv: where its options end and the training command begins, and torchrun's
spellings translated into elastrain's.

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
"""

from __future__ import annotations

import argparse
import os
from typing import TYPE_CHECKING

from elastrain.errors import ConfigError

if TYPE_CHECKING:
    from elastrain.launcher.hosts import HostSource


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
        if args.coordinator_host != "127.0.0.1" or args.coordinator_port not in (None, 0):
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
