"""Jobs that outlive their launcher: how a job's end is judged, and whether it starts again.

A submitted job runs in the cluster's launcher container. When that container dies (killed, its node
lost, the machine restarted), the job's command dies with it: no exit code is written. That is a
*platform* failure, not the user's: the job starts again in the replacement launcher, at most
``max_platform_restarts`` times. An ``elastrain run`` job is started again with ``--rejoin`` on the same
coordinator port and job token, so the workers still running in the other containers are adopted
in memory (nothing is lost); when none are left (they waited ``--heartbeat-timeout``, checkpointed and
exited), the new launcher starts the job afresh, which resumes from its newest durable checkpoint
(``--checkpoint-dir``, ``--resume auto``). Any other command (``horovodrun``, ``deepspeed``, a script)
is started again as it was, and resumes from its own checkpoints.

A command that exits non-zero is the *user's* failure: it is started again only while ``retries``
(Kubernetes' ``backoffLimit``) allows, else the job is Failed with that exit code.

The decisions here are pure: `judge` returns a `Verdict` for what `JobService.poll` saw, and
`restart_command` the command a restart runs.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import random
import socket
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass

from elastrain.db.models import Cluster, ClusterState, Container, ContainerState, RestartPolicy

COORDINATOR_PORT_ENV = "ELASTRAIN_COORDINATOR_PORT"  # `elastrain run --coordinator-port`'s default
COORDINATOR_HOST_ENV = "ELASTRAIN_COORDINATOR_HOST"  # read by launcher.slurm.coordinator_host
JOB_TOKEN_ENV = "ELASTRAIN_JOB_TOKEN"  # the token agents and workers present to the coordinator
COORDINATOR_PORTS = range(28400, 28900)
"""Where the platform puts a submitted ``elastrain run`` job's coordinator (a fixed port per job, so
a replacement launcher listens where the running agents reconnect). Below the kernel's ephemeral range
and clear of torchrun's 29400 and MASTER_PORT's 29500, so a rendezvous typed by hand never takes it."""
DEFAULT_MAX_PLATFORM_RESTARTS = 3
LAUNCHER_GRACE_S = 10.0
"""How long a submitted job's command may be gone, without an exit code, while its launcher still looks
Running with the same pid, before the job is Failed (the reconciler sees a dead launcher within a pass)."""


class Cause(str, enum.Enum):
    """Whose failure ended a run of a job's command."""

    platform = "platform"  # the launcher container died under the command (no exit code)
    user = "user"  # the command exited non-zero


class Outcome(str, enum.Enum):
    """What the control plane does with a job whose command is no longer running."""

    wait = "wait"  # the launcher is gone and its replacement is not Running yet
    restart = "restart"  # start the command again in the (new) launcher
    finish = "finish"  # the job ends with the exit code (Succeeded on 0)


@dataclass(frozen=True)
class Verdict:
    """`judge`'s answer: the outcome, whose failure it was (None for a success) and why, in words."""

    outcome: Outcome
    cause: Cause | None = None
    reason: str = ""


@dataclass(frozen=True)
class Attempts:
    """A job's restart counts and budgets."""

    platform: int = 0
    max_platform: int = DEFAULT_MAX_PLATFORM_RESTARTS
    user: int = 0
    max_user: int = 0


class Launcher(str, enum.Enum):
    """The launcher a job's command ran in, as the control plane sees it now."""

    same = "same"  # still there and Running
    replaced = "replaced"  # it died; its replacement is Running
    coming = "coming"  # it died (or is not seen dead yet); a replacement is on its way
    gone = "gone"  # it died and none will come (the cluster is being deleted, restart policy Never)


def launcher_seen(
    launcher_pid_then: int | None,
    cluster: Cluster | None,
    launcher: Container | None,
    exit_code: int | None,
    gone_for_s: float,
) -> Launcher:
    """What became of the launcher (pid `launcher_pid_then`; None: a job typed in a terminal, never
    started again) a job's command ran in, the command gone for `gone_for_s` with `exit_code`. A launcher
    still shown Running with the same pid is given `LAUNCHER_GRACE_S` for the reconciler to see it die."""
    if cluster is None or cluster.state == ClusterState.Terminating:
        return Launcher.gone
    if launcher_pid_then is None or exit_code is not None:
        return Launcher.same
    if launcher is not None and launcher.state == ContainerState.Running:
        if launcher.pid != launcher_pid_then:
            return Launcher.replaced
        return Launcher.coming if gone_for_s < LAUNCHER_GRACE_S else Launcher.same
    failed = launcher is not None and launcher.state == ContainerState.Failed
    if failed and cluster.restart_policy == RestartPolicy.Never:
        return Launcher.gone
    return Launcher.coming


def judge(exit_code: int | None, launcher: Launcher, attempts: Attempts) -> Verdict:
    """Decide for a job whose command is no longer running.

    `exit_code` is what the command's exit file says (None: no file, the command was killed with its
    container); `launcher` what became of the launcher container it ran in.
    """
    if exit_code == 0:
        return Verdict(Outcome.finish)
    if exit_code is not None:
        if attempts.user < attempts.max_user and launcher in (Launcher.same, Launcher.replaced):
            n = attempts.user + 1
            why = f"the command exited with code {exit_code}; retry {n} of {attempts.max_user}"
            return Verdict(Outcome.restart, Cause.user, why)
        return Verdict(Outcome.finish, Cause.user, f"the command exited with code {exit_code}")
    if launcher == Launcher.same:
        return Verdict(Outcome.finish, Cause.platform, "the command ended without an exit code")
    if launcher == Launcher.gone:
        return Verdict(Outcome.finish, Cause.platform, "the launcher container died and none will replace it")
    if attempts.platform >= attempts.max_platform:
        why = f"the launcher container died and the job's {attempts.max_platform} platform restarts are used"
        return Verdict(Outcome.finish, Cause.platform, why)
    if launcher == Launcher.coming:
        return Verdict(
            Outcome.wait, Cause.platform, "the launcher container died; waiting for its replacement"
        )
    n = attempts.platform + 1
    why = f"the launcher container died; started again in its replacement ({n} of {attempts.max_platform})"
    return Verdict(Outcome.restart, Cause.platform, why)


def is_elastrain_run(command: Sequence[str]) -> bool:
    """Is `command` an ``elastrain run`` (it can adopt its running workers after a launcher loss)?"""
    return len(command) >= 2 and command[0].rsplit("/", 1)[-1] == "elastrain" and command[1] == "run"


def restart_command(command: Sequence[str], cause: Cause) -> list[str]:
    """The command a restart runs: ``elastrain run --rejoin ...`` after a launcher loss, else `command`."""
    if cause == Cause.platform and is_elastrain_run(command) and "--rejoin" not in command:
        return [command[0], command[1], "--rejoin", *command[2:]]
    return list(command)


def coordinator_port(
    taken: Collection[int],
    usable: Callable[[int], bool] = lambda _port: True,
    rng: random.Random | None = None,
) -> int | None:
    """A port of `COORDINATOR_PORTS` not in `taken` (the ports of the running jobs that share a network
    namespace) for which `usable` holds; None when there is none. The first such port, or with `rng` a
    random one: on this machine's network two servers (or a server and a test) choosing at once would
    otherwise both take the first free port and one launcher would find it in use."""
    ports = [p for p in COORDINATOR_PORTS if p not in taken]
    if rng is not None:
        rng.shuffle(ports)
    return next((p for p in ports if usable(p)), None)


def derived_token(secret: str, purpose: str) -> str:
    """The job's token for `purpose` ("report", "coordinator"): the same after every restart, so the
    workers that outlived a launcher keep reporting and reconnecting with what they were given."""
    return hmac.new(secret.encode(), purpose.encode(), hashlib.sha256).hexdigest()[:40]


def port_is_free(port: int) -> bool:
    """Can a coordinator listen on `port` on this machine (every address)?"""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True
