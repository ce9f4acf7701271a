"""Jobs that outlive their launcher: how a job's end is judged, what a restart runs, its ports."""

from __future__ import annotations

import random
import socket

import pytest

from elastrain.cli.run_cmd import port_from_env
from elastrain.errors import ElastrainError
from elastrain.server.job_recovery import (
    COORDINATOR_PORTS,
    Attempts,
    Cause,
    Launcher,
    Outcome,
    coordinator_port,
    derived_token,
    is_elastrain_run,
    judge,
    port_is_free,
    restart_command,
)


def test_a_launcher_lost_under_the_command_is_a_platform_failure_restarted_within_its_budget() -> None:
    verdict = judge(None, Launcher.replaced, Attempts(platform=0, max_platform=3))
    assert (verdict.outcome, verdict.cause) == (Outcome.restart, Cause.platform)
    assert "1 of 3" in verdict.reason
    assert judge(None, Launcher.coming, Attempts()).outcome == Outcome.wait
    spent = judge(None, Launcher.replaced, Attempts(platform=3, max_platform=3))
    assert (spent.outcome, spent.cause) == (Outcome.finish, Cause.platform)
    assert "3 platform restarts are used" in spent.reason
    # a user error never uses the platform budget, and a platform loss never the user's
    assert (
        judge(None, Launcher.replaced, Attempts(platform=0, max_platform=1, user=5, max_user=5)).cause
        == Cause.platform
    )


def test_exit_codes_are_the_users_and_retried_only_within_retries() -> None:
    assert judge(0, Launcher.same, Attempts()).outcome == Outcome.finish
    assert judge(0, Launcher.same, Attempts()).cause is None
    failed = judge(7, Launcher.same, Attempts())
    assert (failed.outcome, failed.cause, failed.reason) == (
        Outcome.finish,
        Cause.user,
        "the command exited with code 7",
    )
    retried = judge(7, Launcher.same, Attempts(user=1, max_user=2))
    assert (retried.outcome, retried.cause) == (
        Outcome.restart,
        Cause.user,
    ) and "retry 2 of 2" in retried.reason
    assert judge(7, Launcher.same, Attempts(user=2, max_user=2)).outcome == Outcome.finish
    assert judge(7, Launcher.gone, Attempts(max_user=2)).outcome == Outcome.finish  # nowhere to run it


def test_no_exit_code_without_a_launcher_loss_or_with_no_replacement_coming_ends_the_job() -> None:
    same = judge(None, Launcher.same, Attempts())
    assert (same.outcome, same.cause) == (Outcome.finish, Cause.platform)
    gone = judge(None, Launcher.gone, Attempts())
    assert gone.outcome == Outcome.finish and "none will replace it" in gone.reason


def test_an_elastrain_run_job_rejoins_its_running_workers_after_a_launcher_loss() -> None:
    command = ["elastrain", "run", "--min-np", "2", "--max-np", "4", "python", "train.py"]
    assert is_elastrain_run(command) and is_elastrain_run(["/opt/venv/bin/elastrain", "run", "x"])
    assert not is_elastrain_run(["horovodrun", "-np", "2", "python", "x"]) and not is_elastrain_run(
        ["elastrain"]
    )
    assert restart_command(command, Cause.platform) == ["elastrain", "run", "--rejoin", *command[2:]]
    assert restart_command(command, Cause.user) == command  # a failed run starts afresh (--resume auto)
    again = restart_command(command, Cause.platform)
    assert restart_command(again, Cause.platform) == again  # one --rejoin, however many losses
    other = ["deepspeed", "train.py"]
    assert restart_command(other, Cause.platform) == other


def test_coordinator_ports_skip_those_taken_and_those_not_free() -> None:
    first = COORDINATOR_PORTS[0]
    assert coordinator_port(set()) == first
    assert coordinator_port({first, first + 1}) == first + 2
    assert coordinator_port(set(), lambda port: port > first + 5) == first + 6
    assert coordinator_port(set(COORDINATOR_PORTS)) is None
    picks = {coordinator_port({first}, rng=random.Random(seed)) for seed in range(20)}
    assert len(picks) > 1 and first not in picks and picks <= set(COORDINATOR_PORTS)
    assert 29400 not in COORDINATOR_PORTS and 29500 not in COORDINATOR_PORTS  # torchrun's, MASTER_PORT's
    with socket.socket() as held:
        held.bind(("", 0))
        held.listen()
        assert not port_is_free(held.getsockname()[1])


def test_a_jobs_tokens_are_stable_and_differ_by_purpose() -> None:
    assert derived_token("s", "report") == derived_token("s", "report")
    assert (
        derived_token("s", "report") != derived_token("s", "coordinator") != derived_token("t", "coordinator")
    )
    assert len(derived_token("s", "report")) == 40


def test_the_coordinator_port_default_comes_from_the_environment() -> None:
    assert port_from_env("") == 0 and port_from_env("29401") == 29401
    with pytest.raises(ElastrainError, match="ELASTRAIN_COORDINATOR_PORT='x' is not a port number"):
        port_from_env("x")


def test_what_became_of_the_launcher_a_command_ran_in() -> None:
    from elastrain.db.models import Cluster, ClusterState, Container, ContainerState, RestartPolicy
    from elastrain.server.job_recovery import LAUNCHER_GRACE_S, launcher_seen

    cluster = Cluster(name="c", state=ClusterState.Running, restart_policy=RestartPolicy.Always)
    same = Container(name="c-launcher", state=ContainerState.Running, pid=100)
    new = Container(name="c-launcher", state=ContainerState.Running, pid=200)
    failed = Container(name="c-launcher", state=ContainerState.Failed, pid=100)
    assert launcher_seen(100, cluster, new, None, 0.0) == Launcher.replaced
    assert launcher_seen(100, cluster, failed, None, 0.0) == Launcher.coming
    assert launcher_seen(100, cluster, None, None, 0.0) == Launcher.coming  # removed, not yet replaced
    # the launcher looks alive with the same pid: the reconciler gets the grace to see it die
    assert launcher_seen(100, cluster, same, None, 1.0) == Launcher.coming
    assert launcher_seen(100, cluster, same, None, LAUNCHER_GRACE_S + 1) == Launcher.same
    assert launcher_seen(100, cluster, new, 0, 0.0) == Launcher.same  # an exit code: the command's own end
    assert launcher_seen(None, cluster, new, None, 0.0) == Launcher.same  # typed in a terminal: never again
    assert launcher_seen(100, None, None, None, 0.0) == Launcher.gone
    cluster.restart_policy = RestartPolicy.Never
    assert launcher_seen(100, cluster, failed, None, 0.0) == Launcher.gone
    cluster.state = ClusterState.Terminating
    assert launcher_seen(100, cluster, new, None, 0.0) == Launcher.gone
