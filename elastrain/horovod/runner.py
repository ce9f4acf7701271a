"""``horovodrun`` on elastrain: Horovod's launcher flags, translated into an ``elastrain run``.

    horovodrun -np 2 -H host1:1,host2:1 python train.py
    horovodrun -np 2 --min-np 2 --max-np 4 --hostfile /etc/mpi/hostfile python train_elastic.py

This is elastrain's implementation of Horovod's launcher, not Horovod: the job runs in native mode
(the script's ``import horovod.torch as hvd`` is elastrain's Horovod API, see
:mod:`elastrain.horovod`), so a hostfile or discovery-script change resizes it live. Everything
after the training command reaches the script untouched. Flags that only tune Horovod's C++ core
are accepted and ignored; MPI flags and unknown flags are refused by name (exit code 2).

Differences from Horovod's horovodrun: a ``--hostfile`` is watched like a discovery script (with
``--min-np``/``--max-np`` its edits resize the job); ``-np`` may be left out when ``--min-np`` or the
hosts say how many to start; ``-np`` above the slots of ``-H``/``--hostfile`` is an error, not a wait;
``--output-filename`` is not supported (the output stays on the terminal, prefixed by worker);
``--ledger``, ``--join-grace`` and ``--mode`` are elastrain's own.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from elastrain.contracts.env import WorkerEnv
from elastrain.horovod.runner_flags import BY_NAME, FLAGS

HOROVOD_VERSION = "0.28.1+elastrain"
UNBOUNDED_NP = 1 << 16  # Horovod: without --max-np an elastic job grows to whatever the hosts offer


class UsageError(Exception):
    """Bad command-line input: one line on stderr, exit code 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    """horovodrun's parser (options only: the training command is split off before parsing)."""
    parser = _Parser(
        prog="horovodrun",
        allow_abbrev=False,
        usage="horovodrun [options] COMMAND [ARGS...]",
        description="elastrain's implementation of Horovod's launcher (not Horovod): runs the command as an "
        "elastic `elastrain run` job whose workers use elastrain's Horovod API.",
        epilog="Flags marked 'accepted, ignored' tune Horovod's C++ core, which does not exist here. Flags "
        "starting with 'elastrain:' are elastrain's own.",
    )
    groups = {
        "run": parser.add_argument_group("launch"),
        "noop": parser.add_argument_group("accepted for compatibility, without effect"),
        "refuse": parser.add_argument_group("refused"),
    }
    for flag in FLAGS:
        group = groups[flag.kind]
        dest = flag.dest or flag.names[-1].lstrip("-").replace("-", "_")
        if flag.nargs == 0:
            group.add_argument(*flag.names, dest=dest, action="store_true", help=flag.help)
        elif flag.nargs == 1:
            group.add_argument(*flag.names, dest=dest, type=flag.type, help=flag.help)
        else:
            group.add_argument(*flag.names, dest=dest, nargs=flag.nargs, help=flag.help)
    return parser


def split_command(argv: list[str]) -> tuple[list[str], list[str]]:
    """(horovodrun's options, the training command): the command starts at the first non-option word."""
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return argv[:i], argv[i + 1 :]
        if not word.startswith("-") or word == "-":
            return argv[:i], argv[i:]
        name, eq, _ = word.partition("=")
        flag = BY_NAME.get(name)
        if flag is None:
            if name in ("-h", "--help"):
                i += 1
                continue
            raise UsageError(f"unrecognized option {name} (see horovodrun --help)")
        i += 1 + (0 if eq else flag.nargs)
    return argv, []


def _with_slots(hosts: str, slots: int | None) -> str:
    """`hosts` (-H) with ``:slots`` added to the hosts given without a slot count."""
    if not slots:
        return hosts

    def has_slots(item: str) -> bool:
        return item.count(":") == 1 or (item.startswith("[") and "]:" in item)  # [v6-addr]:SLOTS

    items = [h.strip() for h in hosts.split(",") if h.strip()]
    return ",".join(h if has_slots(h) else f"{h}:{slots}" for h in items)


def translate(args: argparse.Namespace, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """The ``elastrain`` argv and the environment variables that run what horovodrun was asked."""
    elastic = args.min_np is not None or args.max_np is not None or bool(args.host_discovery_script)
    if args.np is None and not elastic and not (args.hosts or args.hostfile):
        raise UsageError("-np/--num-proc is required (the number of training processes)")
    out = ["run", "--mode", args.mode or "native"]
    env: dict[str, str] = {}
    if args.np is not None:  # without it: --min-np when elastic, else every slot of the hosts
        out += ["-np", str(args.np)]
    if elastic:
        low = args.min_np if args.min_np is not None else args.np
        if low is not None:
            out += ["--min-np", str(low)]
        out += ["--max-np", str(args.max_np if args.max_np is not None else UNBOUNDED_NP)]
    if args.hosts:
        out += ["-H", _with_slots(args.hosts, args.slots)]
    if args.hostfile:
        out += ["--hostfile", args.hostfile]
    if args.host_discovery_script:
        out += ["--host-discovery-script", args.host_discovery_script]
    start = args.start_timeout if args.start_timeout is not None else os.environ.get("HOROVOD_START_TIMEOUT")
    if start is not None:
        out += ["--start-timeout", str(start)]
    elastic_timeout = (
        args.elastic_timeout
        if args.elastic_timeout is not None
        else os.environ.get("HOROVOD_ELASTIC_TIMEOUT")
    )
    if elastic_timeout is not None:
        out += ["--elastic-timeout", str(elastic_timeout)]
    if args.ledger:
        out += ["--ledger", args.ledger]
    if args.join_grace is not None:
        out += ["--join-grace", str(args.join_grace)]
    if args.verbose or (args.log_level or "").upper() in ("DEBUG", "TRACE"):
        out.append("-v")
    if args.log_level:
        env["HOROVOD_LOG_LEVEL"] = args.log_level
    if args.nics:
        env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = args.nics
    if args.gloo_timeout is not None:
        env[WorkerEnv.COLLECTIVE_TIMEOUT] = str(args.gloo_timeout)
    return [*out, "--", *command], env


def check_slots(args: argparse.Namespace) -> None:
    """Refuse -np above the slots of -H or --hostfile (a discovery script may offer more later)."""
    from elastrain.hostfile import parse_host_list, read_hostfile
    from elastrain.launcher.attach import container_path

    if args.np is None:
        return
    if args.hostfile:
        slots, where = read_hostfile(container_path(args.hostfile)).total_slots, f"--hostfile {args.hostfile}"
    elif args.hosts:
        slots, where = parse_host_list(_with_slots(args.hosts, args.slots)).total_slots, f"-H {args.hosts}"
    else:
        return
    if args.np > slots:
        raise UsageError(
            f"-np {args.np} is larger than the {slots} slots of {where}; add hosts or slots, or lower -np"
        )


_WRAPPER = """import subprocess, sys
out = subprocess.run([{script!r}], capture_output=True, text=True, timeout=30)
if out.returncode:
    sys.stderr.write(out.stderr)
    sys.exit(out.returncode)
for line in out.stdout.splitlines():
    line = line.strip()
    if line and not line.startswith("#") and ":" not in line:
        line = line + ":{slots}"
    print(line)
"""


def discovery_with_slots(script: str, slots: int, workdir: Path) -> str:
    """A discovery script that adds ``:slots`` to the hosts `script` prints without them (a relative path)."""
    from elastrain.launcher.attach import container_path

    wrapper = workdir / "discover_hosts.py"
    real = os.path.abspath(container_path(script))
    wrapper.write_text(f"#!{sys.executable}\n" + _WRAPPER.format(script=real, slots=slots))
    wrapper.chmod(0o755)
    return os.path.relpath(wrapper)


def check_build() -> str:
    """What ``horovodrun --check-build`` prints."""
    from elastrain.horovod.basics import nccl_built

    def box(on: bool) -> str:
        return "[X]" if on else "[ ]"

    return (
        f"Horovod v{HOROVOD_VERSION}: elastrain's implementation of the Horovod API (not Horovod)\n\n"
        f"Available Frameworks:\n    [ ] TensorFlow\n    [X] PyTorch\n    [ ] MXNet\n\n"
        f"Available Controllers:\n    [ ] MPI\n    [X] Gloo\n\n"
        f"Available Tensor Operations:\n    {box(nccl_built())} NCCL\n    [ ] DDL\n    [ ] CCL\n"
        f"    [ ] MPI\n    [X] Gloo\n"
    )


def _notes(given: list[str]) -> None:
    """Refuse the refused flags; one note for accepted flags that change nothing a user would expect."""
    for name in given:
        flag = BY_NAME[name]
        if flag.kind == "refuse":
            raise UsageError(f"{name}: {flag.help}")
        if flag.kind == "noop" and name in (
            "--output-filename",
            "-i",
            "--ssh-identity-file",
            "--reset-limit",
        ):
            print(f"horovodrun: note: {name} {flag.help}", file=sys.stderr)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """(horovodrun's options, the training command, untouched); ``UsageError`` for bad options."""
    head, command = split_command(argv)
    args = build_parser().parse_args(head)
    args.given = [w.partition("=")[0] for w in head if w.partition("=")[0] in BY_NAME]
    if args.mode not in (None, "native", "restart"):
        raise UsageError(f"--mode must be native or restart, got {args.mode!r}")
    return args, command


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``horovodrun`` command; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    workdir: Path | None = None
    try:
        try:
            args, command = parse(argv)
        except SystemExit as exc:  # --help
            return int(exc.code or 0)
        if args.version:
            print(HOROVOD_VERSION)
            return 0
        if args.check_build:
            print(check_build(), end="")
            return 0
        _notes(args.given)
        if not command:
            raise UsageError("no training command given; e.g. horovodrun -np 2 python train.py")
        elastrain_argv, env = translate(args, command)
        check_slots(args)
        if args.slots and args.host_discovery_script:
            workdir = Path(tempfile.mkdtemp(prefix="horovodrun-"))
            at = elastrain_argv.index("--host-discovery-script") + 1
            elastrain_argv[at] = discovery_with_slots(args.host_discovery_script, args.slots, workdir)
        os.environ.update(env)
        from elastrain.cli.main import main as elastrain_main

        return elastrain_main(elastrain_argv)
    except UsageError as exc:
        print(f"horovodrun: error: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:
        from elastrain.errors import ElastrainError

        if not isinstance(exc, ElastrainError):
            raise
        print(f"horovodrun: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
