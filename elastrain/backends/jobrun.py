"""Runs one detached job command and records how it ended (so a restarted server can tell).

``python -m elastrain.backends.jobrun --exit-file F -- CMD...`` starts CMD (same process group),
forwards SIGTERM/SIGINT to it, and when it ends writes its exit code to F atomically.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    """Run the command; exit with its code."""
    parser = argparse.ArgumentParser(prog="elastrain-jobrun")
    parser.add_argument("--exit-file", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    try:
        child = subprocess.Popen(command)
    except OSError as exc:
        print(f"elastrain job: cannot run {command[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
        code = 127
    else:

        def forward(signum: int, _frame: object) -> None:
            if child.poll() is None:
                child.send_signal(signum)

        signal.signal(signal.SIGTERM, forward)
        signal.signal(signal.SIGINT, forward)
        code = child.wait()
        if code < 0:
            code = 128 - code
    tmp = args.exit_file.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)  # the job's own
    with os.fdopen(fd, "w") as f:
        f.write(f"{code}\n")
    os.replace(tmp, args.exit_file)
    return code


if __name__ == "__main__":
    sys.exit(main())
