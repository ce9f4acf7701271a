"""`elastrain run` inside a control-plane container: container paths, and becoming a job of the server.

A shell opened on a launcher container (the portal's terminal, ``elastrain cluster exec``) carries
``ELASTRAIN_CONTAINER_ROOT`` and, from the server, ``ELASTRAIN_ATTACH_URL``/``ELASTRAIN_ATTACH_TOKEN``.
Then `elastrain run`:

* reads container paths as the container sees them (``/etc/mpi/hostfile``, mount targets such as
  ``/data/train.py``): an absolute path that exists under the container root means that one;
* registers itself as a job, so the workers report progress (the job page charts it), and copies its
  output to the job's log and its exit code next to it, as ``elastrain job submit`` jobs have.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from elastrain.contracts.env import ReportEnv, WorkerEnv
from elastrain.httpunix import urlopen

ROOT_ENV = WorkerEnv.CONTAINER_ROOT
ATTACH_URL_ENV = "ELASTRAIN_ATTACH_URL"
ATTACH_TOKEN_ENV = "ELASTRAIN_ATTACH_TOKEN"


def container_path(arg: str, environ: dict[str, str] | None = None) -> str:
    """`arg` mapped into the container root when it is an absolute path whose top directory is there.

    ``/etc/mpi/hostfile`` or ``/data/ckpt`` (a mount) read the container's; ``/usr/bin/python`` (no
    ``usr`` in the container root) stays the machine's.
    """
    root = (os.environ if environ is None else environ).get(ROOT_ENV, "")
    if not root or not arg.startswith("/") or arg.startswith(root.rstrip("/") + "/"):
        return arg
    top = arg.lstrip("/").split("/", 1)[0]
    return str(Path(root) / arg.lstrip("/")) if top and os.path.lexists(Path(root) / top) else arg


@dataclass(frozen=True)
class AttachedJob:
    """A job the control plane created for this `elastrain run`."""

    id: int
    env: dict[str, str]  # what the workers need to report progress
    log_path: Path
    exit_path: Path


def attach(command: list[str], environ: dict[str, str] | None = None) -> AttachedJob | None:
    """Register with the control plane when started in one of its shells (None otherwise or on failure).

    `command` is what the job list shows (the ``elastrain run ...`` line as typed).
    """
    env = os.environ if environ is None else environ
    url, token = env.get(ATTACH_URL_ENV, ""), env.get(ATTACH_TOKEN_ENV, "")
    if not url or not token or env.get(WorkerEnv.JOB_ID):
        return None  # not in a control-plane shell, or already a submitted job
    request = urllib.request.Request(
        f"{url.rstrip('/')}/api/v1/jobs/attach",
        data=json.dumps({"command": command, "pid": os.getpid()}).encode(),
        method="POST",
        headers={"Content-Type": "application/json", "X-Attach-Token": token},
    )
    try:
        with urlopen(request, timeout=10) as response:
            body = json.loads(response.read())
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"elastrain: not reporting to the control plane ({exc}); training goes on", file=sys.stderr)
        return None
    print(f"elastrain: this run is job {body['id']} of the control plane", file=sys.stderr)
    job_env = ReportEnv(url=body["report_url"], job_id=str(body["id"]), token=body["report_token"]).to_env()
    return AttachedJob(int(body["id"]), job_env, Path(body["log_path"]), Path(body["exit_path"]))


class OutputTee:
    """Copies everything written to this process's stdout/stderr (and its children's) into a log file.

    fd 1 and 2 become a pipe (children inherit it); a thread copies the pipe to the original
    terminal and to the log, so the user still sees the output where they typed the command.
    """

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._saved: tuple[int, int] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Redirect fd 1 and 2 through the copier."""
        sys.stdout.flush()
        sys.stderr.flush()
        self._saved = (os.dup(1), os.dup(2))
        read_end, write_end = os.pipe()
        log = open(self.log_path, "ab", buffering=0)  # noqa: SIM115 - closed by the copier at EOF
        os.dup2(write_end, 1)
        os.dup2(write_end, 2)
        os.close(write_end)
        terminal = self._saved[0]

        def copy() -> None:
            with log:
                while chunk := os.read(read_end, 65536):
                    for write in (lambda b: os.write(terminal, b), log.write):
                        try:
                            write(chunk)
                        except OSError:
                            pass  # a closed terminal must not stop the log (or the training)
            os.close(read_end)

        self._thread = threading.Thread(target=copy, name="elastrain-tee", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 2.0) -> None:
        """Restore fd 1 and 2 and let the copier drain (agents that outlive us may keep the pipe open)."""
        if self._saved is None:
            return
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(self._saved[0], 1)
        os.dup2(self._saved[1], 2)
        for fd in self._saved:
            os.close(fd)
        self._saved = None
        if self._thread is not None:
            self._thread.join(timeout_s)


def record_exit(job: AttachedJob, code: int) -> None:
    """Leave the exit code where the server's job monitor reads it."""
    try:
        job.exit_path.write_text(f"{code}\n")
    except OSError as exc:
        print(f"elastrain: cannot record the exit code in {job.exit_path}: {exc}", file=sys.stderr)
