"""Running a tenant's command in a cluster's container: the one path exec, jobs and the portal terminal take.

`ExecService.find` applies the rules every command obeys (host commands allowed on this backend: 403;
the cluster visible to the caller: 404; owned by them: 403) and picks the container (the launcher
unless one is named); `ExecService.start` starts a command there (container paths rewritten where the
backend runs it on this machine; detached under ``elastrain.backends.jobrun`` for a job);
`ExecService.stream` runs one attached and streams its output as NDJSON.
"""

from __future__ import annotations

import codecs
import dataclasses
import json
import os
import re
import secrets
import select
import signal
import subprocess
import sys
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from elastrain.backends.api import Backend, ContainerSpec
from elastrain.backends.local import HOSTFILE_PATH
from elastrain.db.models import Cluster, Container, ContainerRole, User
from elastrain.db.repository import find_cluster
from elastrain.server.errors import Forbidden, InvalidRequest, NotFound
from elastrain.server.inventory import Inventory
from elastrain.server.reconciler import container_spec
from elastrain.server.slots import UserSlots, exec_slots

EXEC_ID_ENV = "ELASTRAIN_EXEC_ID"  # marks the processes of one exec call, so they can be stopped


def host_commands_refusal(backend: str | None) -> str:
    """The one line a tenant's refused exec, job or terminal gets (403) on `backend` (process, slurm)."""
    where = {"slurm": "the Slurm backend, which runs them on the server's machine as its user"}.get(
        backend or "", "the process backend, which isolates nothing"
    )
    return (
        f"exec, jobs and terminals are refused on {where}; start the server with "
        "--insecure-host-commands to allow them (every user trusted), or use --backend container"
    )


HOST_COMMANDS_REFUSED = host_commands_refusal("process")


def check_owner(cluster: Cluster, user: User) -> None:
    """Commands run only for the cluster's owner (an admin may see the cluster, not exec into it)."""
    if cluster.owner_id != user.id:
        raise Forbidden(f"only the owner of cluster {cluster.name!r} can run commands in it")


def check_host_commands(allowed: bool, reason: str = HOST_COMMANDS_REFUSED) -> None:
    """Refuse (403, `reason`) running a tenant's command (exec, job, terminal) where it would run
    unisolated on the host (the process and Slurm backends, unless the server was started with
    --insecure-host-commands)."""
    if not allowed:
        raise Forbidden(reason)


def launcher_of(cluster: Cluster) -> Container | None:
    """The cluster's launcher container row, if it has one."""
    return next((k for k in cluster.containers if k.role == ContainerRole.launcher), None)


def rewrite_command(command: list[str], hostfile: Path, mounts: dict[str, Path]) -> list[str]:
    """Map container paths in `command` to this machine: the hostfile and the mount targets.

    A path is rewritten wherever it starts a word (also inside ``sh -c "..."`` strings or after ``=``).
    """
    out = []
    for arg in command:
        arg = arg.replace(HOSTFILE_PATH, str(hostfile))
        for target, local in mounts.items():
            pattern = r"(?<![\w./-])" + re.escape(target) + r"(?=/|$|[\s'\";:])"
            arg = re.sub(pattern, str(local).replace("\\", "\\\\"), arg)
        out.append(arg)
    return out


def command_for(backend: Backend, spec: ContainerSpec, command: list[str]) -> list[str]:
    """`command` as it must be run: container paths rewritten where the backend runs it on this machine."""
    if not backend.translates_paths:
        return list(command)
    hostfile = backend.container_path(spec.cluster, spec.name, HOSTFILE_PATH)
    mounts = {m.target: backend.container_path(spec.cluster, spec.name, m.target) for m in spec.mounts}
    return rewrite_command(command, hostfile, mounts)


def _released_after(chunks: Iterator[bytes], release: Callable[[], None]) -> Iterator[bytes]:
    try:
        yield from chunks
    finally:
        release()


@dataclass
class ExecService:
    """Finds the container a tenant's command runs in and starts it there through the backend."""

    backend: Backend
    inventory: Inventory
    host_commands_allowed: bool = True  # False: process/Slurm backend without --insecure-host-commands
    host_commands_refusal: str = HOST_COMMANDS_REFUSED  # the 403's one line (`host_commands_refusal`)
    attach_env: Callable[[User, str], dict[str, str]] | None = None  # JobService.attach_env
    streams: UserSlots = dataclasses.field(default_factory=exec_slots)  # exec streams per user

    def find(
        self, session: Session, user: User, name: str, container: str | None = None
    ) -> tuple[Cluster, Container | None]:
        """The caller's cluster `name` and its container `container` (the launcher by default; None when
        the cluster has no such container now). 403 where host commands are off; 404 for a cluster the
        caller cannot see; 403 for one they see but do not own (an admin's view of a tenant's)."""
        check_host_commands(self.host_commands_allowed, self.host_commands_refusal)
        cluster = find_cluster(session, user, name)
        if cluster is None:
            raise NotFound(f"cluster {name!r} not found")
        check_owner(cluster, user)
        if container:
            return cluster, next((k for k in cluster.containers if k.name == container), None)
        return cluster, launcher_of(cluster)

    def spec(self, cluster: Cluster, container: Container) -> ContainerSpec:
        """What the backend needs to run commands in `container`."""
        return container_spec(cluster, container, self.inventory.real)

    def start(
        self,
        spec: ContainerSpec,
        command: list[str],
        *,
        env: dict[str, str] | None = None,
        log_path: Path | None = None,
        exit_file: str | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start `command` in the container with `env` added; output to a pipe (or `log_path`). With
        `exit_file` (a container path) it runs detached under ``elastrain.backends.jobrun``, which
        writes its exit code there."""
        command = command_for(self.backend, spec, command)
        if exit_file is not None:
            python = sys.executable if self.backend.translates_paths else "python"  # the image's own
            command = [python, "-m", "elastrain.backends.jobrun", "--exit-file", exit_file, "--", *command]
        spec = dataclasses.replace(spec, env={**spec.env, **(env or {})})
        return self.backend.exec(spec, command, log_path=log_path)

    def stream(self, user: User, spec: ContainerSpec, command: list[str]) -> Iterator[bytes]:
        """Run `command` attached; NDJSON chunks ``{"out"}``... then ``{"exit"}``. A client that goes
        away stops it (inside the container too). An ``elastrain run`` started so becomes a job.
        At most `streams.limit` per user at once (TooMany, 429, beyond): each is a process here."""
        release = self.streams.open(user)
        try:
            exec_id = secrets.token_hex(8)
            env = {EXEC_ID_ENV: exec_id}
            if self.attach_env is not None:
                env.update(self.attach_env(user, spec.cluster))
            try:
                proc = self.start(spec, command, env=env)
            except OSError as exc:
                first = command_for(self.backend, spec, command)[0]
                raise InvalidRequest(f"cannot run {first!r}: {exc.strerror}") from None
        except BaseException:
            release()
            raise
        backend, running = self.backend, dataclasses.replace(spec, env={**spec.env, **env})

        def stop() -> None:  # the client went away: stop the command, inside the container too
            backend.stop_processes(running, EXEC_ID_ENV, exec_id, proc.pid, signal.SIGTERM)

        chunks = _released_after(stream_output(proc, stop), release)
        weakref.finalize(chunks, release)  # a stream never iterated (its response never sent)
        return chunks


def stream_output(proc: subprocess.Popen[bytes], stop: Callable[[], None]) -> Iterator[bytes]:
    """`proc`'s output as NDJSON ``{"out": TEXT}`` lines (a blank keep-alive line each idle second),
    then ``{"exit": CODE}``; `stop` is called when the consumer goes away before the end."""
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    try:
        while True:
            ready, _w, _x = select.select([fd], [], [], 1.0)
            if not ready:  # a keep-alive blank line: a closed client is noticed and the command stopped
                yield b"\n"
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            text = decoder.decode(chunk)
            if text:
                yield (json.dumps({"out": text}) + "\n").encode()
        code = proc.wait()
        yield (json.dumps({"exit": code}) + "\n").encode()
    finally:
        if proc.poll() is None:
            stop()
            proc.wait()
        proc.stdout.close()
