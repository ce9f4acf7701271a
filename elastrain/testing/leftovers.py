"""The leave-nothing check of a test run: what the run left behind, listed; non-zero when anything.

``python -m elastrain.testing.leftovers mark STATE`` before the run records the time and what exists
already (on a shared machine others' things are not the run's); ``python -m elastrain.testing.leftovers
check STATE`` after it lists, and fails on, what is new and still there:

* podman containers and networks named ``elastrain-*`` (skipped where podman is not installed);
* processes of the run: started after the mark, with ``elastrain`` in an argument or an ``ELASTRAIN_*``
  variable in their environment (workers, agents, servers, the private Slurm cluster's daemons);
  with ``--tag NAME=VALUE`` only those whose environment has it (a suite that tags its processes);
* directories ``elastrain-*`` in the system temp dir changed after the mark.

``check --since EPOCH`` needs no state file (then nothing counts as existing before).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

PREFIX = "elastrain-"
_PROC = Path("/proc")


@dataclass
class Snapshot:
    """What exists at one moment: the time, containers, networks, temp dirs and process ids."""

    at: float
    containers: list[str] = field(default_factory=list)
    networks: list[str] = field(default_factory=list)
    temp_dirs: list[str] = field(default_factory=list)
    pids: list[int] = field(default_factory=list)


def _podman_names(*args: str) -> list[str]:
    """``podman ARGS`` output lines that start with the prefix ([] without podman)."""
    exe = shutil.which("podman")
    if exe is None:
        return []
    try:
        out = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return sorted(line.strip() for line in out.splitlines() if line.strip().startswith(PREFIX))


def temp_dirs(since: float, root: Path | None = None) -> list[str]:
    """``elastrain-*`` directories of the temp dir whose last change is at or after `since`."""
    root = root or Path(tempfile.gettempdir())
    found = []
    for entry in root.glob(f"{PREFIX}*"):
        try:
            if entry.is_dir() and not entry.is_symlink() and entry.stat().st_mtime >= since:
                found.append(str(entry))
        except OSError:
            continue
    return sorted(found)


def _boot_time() -> float:
    for line in (_PROC / "stat").read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0


def _started_at(pid: int, boot: float) -> float:
    """When process `pid` started (wall clock), from /proc/PID/stat."""
    fields = (_PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()
    return boot + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def _ancestors() -> set[int]:
    """This process and its parents (the make and shell that run the check are not leftovers)."""
    pids, pid = set(), os.getpid()
    while pid > 1 and pid not in pids:
        pids.add(pid)
        try:
            pid = int((_PROC / str(pid) / "stat").read_text().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            break
    return pids


def _is_the_runs(pid: int, tag: str | None) -> bool:
    entry = _PROC / str(pid)
    environ = (entry / "environ").read_bytes().split(b"\0")
    if tag is not None:
        return tag.encode() in environ
    if any(a and PREFIX[:-1].encode() in a for a in (entry / "cmdline").read_bytes().split(b"\0")):
        return True
    return any(v.startswith(b"ELASTRAIN_") for v in environ)


def processes(since: float, tag: str | None = None) -> dict[int, str]:
    """pid -> command line of the run's processes started at or after `since` (see the module doc)."""
    boot, skip, found = _boot_time(), _ancestors(), {}
    for entry in _PROC.iterdir():
        if not entry.name.isdigit() or int(entry.name) in skip:
            continue
        pid = int(entry.name)
        try:
            if _started_at(pid, boot) + 0.5 < since or not _is_the_runs(pid, tag):
                continue
            if (entry / "stat").read_text().rpartition(")")[2].split()[0] == "Z":
                continue  # a zombie holds nothing; its parent is what counts, and is listed
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):
            continue  # gone meanwhile, or not ours to read
        found[pid] = argv[:200]
    return found


def snapshot(at: float | None = None) -> Snapshot:
    """What exists now (`at`: the mark's time, default now)."""
    now = time.time() if at is None else at
    return Snapshot(
        now,
        _podman_names("ps", "--all", "--format", "{{.Names}}"),
        _podman_names("network", "ls", "--format", "{{.Name}}"),
        temp_dirs(0.0),
        sorted(int(e.name) for e in _PROC.iterdir() if e.name.isdigit()),
    )


def leftovers(before: Snapshot, tag: str | None = None) -> list[str]:
    """One line per thing the run left: new since `before` and still there."""
    now = snapshot()
    lines = [f"podman container {n}" for n in now.containers if n not in before.containers]
    lines += [f"podman network {n}" for n in now.networks if n not in before.networks]
    old_pids = set(before.pids)
    lines += [
        f"process {pid}: {argv}" for pid, argv in processes(before.at, tag).items() if pid not in old_pids
    ]
    lines += [f"temp dir {d}" for d in temp_dirs(before.at) if d not in before.temp_dirs]
    return lines


def main(argv: list[str] | None = None) -> int:
    """``mark STATE`` | ``check (STATE | --since EPOCH) [--tag NAME=VALUE]``: 0 when nothing is left."""
    parser = argparse.ArgumentParser(prog="python -m elastrain.testing.leftovers", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)
    mark = sub.add_parser("mark", help="record the start of a run")
    mark.add_argument("state", type=Path)
    check = sub.add_parser("check", help="list what the run left behind; exit 1 if anything")
    check.add_argument("state", type=Path, nargs="?")
    check.add_argument("--since", type=float, help="the run's start (seconds since the epoch)")
    check.add_argument("--tag", help="NAME=VALUE: only processes with this in their environment")
    args = parser.parse_args(argv)
    if args.action == "mark":
        args.state.write_text(json.dumps(asdict(snapshot())))
        return 0
    if args.state is not None:
        try:
            before = Snapshot(**json.loads(args.state.read_text()))
        except (OSError, ValueError, TypeError) as exc:
            parser.error(f"cannot read {args.state} ({exc}); write it first with `mark {args.state}`")
    elif args.since is not None:
        before = Snapshot(args.since)
    else:
        parser.error("give the STATE file written by `mark`, or --since EPOCH")
    if args.tag is not None and "=" not in args.tag:
        parser.error(f"--tag {args.tag!r}: write it as NAME=VALUE")
    left = leftovers(before, args.tag)
    for line in left:
        print(f"left behind: {line}")
    print(f"leave-nothing check: {len(left)} thing(s) left behind", file=sys.stderr)
    return 1 if left else 0


if __name__ == "__main__":
    sys.exit(main())
