"""The generation cycle tells elastrain's collective failures from the user's errors, and ends the
worker with typed exceptions (no ``sys.exit`` in the library): scripted with a fake rendezvous."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from typing import Any

import pytest
import torch
import torch.distributed as dist

from elastrain.errors import (
    CoordinatorGone,
    HostsUpdatedInterrupt,
    JobFailed,
    PeerFailure,
    WorkerLeft,
)
from elastrain.rendezvous.api import Cause, Generation, JoinOutcome, JoinResult, Member, Rendezvous
from elastrain.runtime.connection import Runtime
from elastrain.runtime.context import LaunchContext
from elastrain.runtime.cycle import GenerationCycle
from elastrain.runtime.gradsync import GradientSync, StepShape
from elastrain.runtime.state import State


class FakeRendezvous(Rendezvous):
    """Admits the worker to generation 1, 2, ... (a world of one); records what it was told."""

    def __init__(self, outcomes: list[JoinOutcome] | None = None) -> None:
        self.outcomes = list(outcomes or [])
        self.joins = 0
        self.errors: list[str] = []
        self.done = 0
        self.first_steps: list[int] = []
        self.closed = False
        self.is_pending = False

    def join(self, committed_step: int) -> JoinResult:
        self.joins += 1
        outcome = self.outcomes.pop(0) if self.outcomes else JoinOutcome.ADMITTED
        if outcome != JoinOutcome.ADMITTED:
            return JoinResult(outcome, None, "told so")
        member = Member("w0", "127.0.0.1", 1, committed_step)
        return JoinResult(outcome, Generation(self.joins, (member,), Cause.START, "127.0.0.1:1"))

    def pending(self) -> bool:
        return self.is_pending

    def report_first_step(self, generation: int, at: float) -> None:
        self.first_steps.append(generation)

    def request_leave(self) -> None:
        pass

    def report_done(self) -> None:
        self.done += 1

    def report_error(self, traceback_text: str) -> None:
        self.errors.append(traceback_text)

    def close(self) -> None:
        self.closed = True


def managed_runtime(rendezvous: FakeRendezvous) -> Runtime:
    """A runtime as under `elastrain run`, whose group building is a no-op (no peers here)."""
    rt = Runtime(LaunchContext(coordinator="127.0.0.1:1", worker_id="w0", backend="gloo"), rendezvous)
    rt.groups.build = lambda generation, rank: None  # type: ignore[method-assign]
    return rt


def test_a_users_runtime_error_mentioning_timeout_fails_the_job() -> None:
    rdzv = FakeRendezvous()
    rt = managed_runtime(rdzv)
    calls = []

    def train(state: State) -> None:
        calls.append(state.step)
        raise RuntimeError("connection timeout in my parser")

    with pytest.raises(JobFailed) as failed:
        GenerationCycle.of(State(), rt).run(train, (), {})
    assert calls == [0] and rdzv.joins == 1  # not retried as a peer failure
    assert failed.value.reported and isinstance(failed.value.__cause__, RuntimeError)
    assert len(rdzv.errors) == 1 and "connection timeout in my parser" in rdzv.errors[0]
    assert rdzv.closed and rdzv.done == 0


def test_standalone_user_errors_pass_through_unchanged() -> None:
    rt = Runtime(LaunchContext(backend="gloo"), None)

    def train(state: State) -> None:
        raise RuntimeError("connection timeout in my parser")

    with pytest.raises(RuntimeError, match="my parser"):
        GenerationCycle.of(State(), rt).run(train, (), {})


def test_a_failing_elastrain_collective_is_a_peer_failure_and_the_cycle_rejoins(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rdzv = FakeRendezvous()
    rt = managed_runtime(rdzv)
    state = State(epoch=0)
    failures = [RuntimeError("[gloo] Connection closed by peer")]

    def all_reduce(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        if failures:
            raise failures.pop()

    monkeypatch.setattr(dist, "all_reduce", all_reduce)

    def train(state: State) -> str:
        state.epoch += 1  # type: ignore[attr-defined]
        state.commit()  # the pending check is elastrain's collective: it fails the first time
        return "done"

    assert GenerationCycle.of(state, rt).run(train, (), {}) == "done"
    assert rdzv.joins == 2 and rdzv.errors == [] and rdzv.done == 1
    assert state.step == 2 and state.epoch == 2  # type: ignore[attr-defined]  # the step had been committed before the check failed


def test_peer_failure_is_chained_from_the_backend_error(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = managed_runtime(FakeRendezvous())
    cause = RuntimeError("Connection reset by peer")

    def all_reduce(*args: Any, **kwargs: Any) -> None:
        raise cause

    monkeypatch.setattr(dist, "all_reduce", all_reduce)
    with pytest.raises(PeerFailure) as failed:
        rt.agree_pending(False)
    assert failed.value.__cause__ is cause

    grads = GradientSync(lambda: None)
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    params = list(model.parameters())
    with pytest.raises(PeerFailure, match="gradient all-reduce") as failed:
        grads.allreduce(params, StepShape(1, 1, True), "mean", False, True)
    assert failed.value.__cause__ is cause


def test_a_group_that_cannot_be_built_is_a_peer_failure(monkeypatch: pytest.MonkeyPatch) -> None:
    rt = Runtime(LaunchContext(coordinator="127.0.0.1:1", worker_id="w0", backend="gloo"), FakeRendezvous())

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise dist.DistNetworkError("connect() timed out")

    monkeypatch.setattr(dist, "TCPStore", refuse)
    with pytest.raises(PeerFailure, match="building the process group"):
        rt.ensure_group(-1)


def test_a_worker_told_to_leave_raises_worker_left_with_exit_code_0() -> None:
    rdzv = FakeRendezvous([JoinOutcome.LEAVE])
    with pytest.raises(WorkerLeft) as left:
        GenerationCycle.of(State(), managed_runtime(rdzv)).run(lambda state: None, (), {})
    assert left.value.code == 0 and rdzv.closed
    with pytest.raises(WorkerLeft) as over:
        managed_runtime(FakeRendezvous([JoinOutcome.JOB_OVER])).ensure_group(-1)
    assert over.value.code == 0


def test_coordinator_gone_raises_with_exit_code_3(capsys: pytest.CaptureFixture[str]) -> None:
    rdzv = FakeRendezvous()
    rt = managed_runtime(rdzv)

    def train(state: State) -> None:
        rdzv.coordinator_gone = True
        raise HostsUpdatedInterrupt("the coordinator is gone")

    with pytest.raises(CoordinatorGone) as gone:
        GenerationCycle.of(State(), rt).run(train, (), {})
    assert gone.value.code == 3
    assert "did not come back" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("raise_", "code", "traceback"),
    [
        ("JobFailed('RuntimeError: boom', reported=True)", 1, False),
        ("JobFailed('RuntimeError: boom')", 1, True),
        ("WorkerLeft('scale-in')", 0, False),
        ("CoordinatorGone('gone')", 3, False),
        ("RuntimeError('boom')", 1, True),
    ],
)
def test_the_entry_point_policy_decides_the_exit_code(raise_: str, code: int, traceback: bool) -> None:
    script = textwrap.dedent(
        f"""
        from elastrain.errors import CoordinatorGone, JobFailed, WorkerLeft
        from elastrain.runtime.entry import install_exit_policy
        install_exit_policy()
        raise {raise_}
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert ("Traceback" in done.stderr) == traceback, done.stderr
