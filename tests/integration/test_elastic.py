"""Live resize, failures and graceful leaves with real processes (gloo on CPU)."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from elastrain.testing.jobs import EXAMPLE, ElasticJob, assert_exactly_once, hosts

pytestmark = pytest.mark.timeout(240)

EPOCHS = 3
# float64 + plain SGD: every run must end with the parameters of a constant 2-worker run (fixed policy)
TRAINING = ["--dtype", "float64", "--optimizer", "sgd", "--lr", "0.05"]


def example(params_out: Path, *extra: str, epochs: int = EPOCHS, sleep: float = 0.03) -> list[str]:
    """The example job; it sleeps `sleep` per step only while the `slow` file exists (the test's faults)."""
    slow = params_out.parent / "slow"
    slow.touch()
    return [
        "python",
        str(EXAMPLE),
        "--epochs",
        str(epochs),
        "--step-sleep",
        str(sleep),
        "--slow-while",
        str(slow),
        *TRAINING,
        "--params-out",
        str(params_out),
        *extra,
    ]


def full_speed(tmp_path: Path) -> None:
    """The faults are done: let the job run at full speed to the end."""
    (tmp_path / "slow").unlink(missing_ok=True)


@pytest.fixture(scope="module", autouse=True)
def small_gradient_buckets() -> Iterator[None]:
    """The example's CNN (80 kB of float64 gradients) in 16 kB buckets: every run overlaps all-reduces."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ELASTRAIN_BUCKET_BYTES", "16384")
        yield


@pytest.fixture(scope="module")
def reference_params(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    """Final parameters of a constant 2-worker run: what every elastic run must end with."""

    work = tmp_path_factory.mktemp("reference")
    job = ElasticJob(work, hosts(2), ["-np", "2"], example(work / "params.pt", sleep=0.0))
    try:
        assert job.wait() == 0, job.output()
    finally:
        job.cleanup()
    return torch.load(work / "params.pt")


def assert_same_params(reference: dict[str, torch.Tensor], path: Path) -> None:
    final = torch.load(path)
    for name, ref in reference.items():
        rel = (ref - final[name]).norm() / ref.norm().clamp_min(1e-12)
        assert rel.item() < 1e-5, (name, rel.item())


def member_pids(generation: dict) -> dict[str, int]:
    return {m["worker_id"]: m["pid"] for m in generation["members"]}


def test_scale_out_2_to_4_then_in_to_2_keeps_pids_and_data(
    elastic_job, tmp_path: Path, reference_params
) -> None:
    job = elastic_job(
        hosts(2), ["--min-np", "2", "--max-np", "4", "--join-grace", "20"], example(tmp_path / "p.pt")
    )
    first = job.wait_world(2, 20)
    job.set_hosts(hosts(4))
    grown = job.wait_world(4, 20)
    job.set_hosts(hosts(2))
    shrunk = job.wait_world(2, 5)
    full_speed(tmp_path)
    assert job.wait() == 0, job.output()

    original = member_pids(first)
    assert {w: p for w, p in member_pids(grown).items() if w in original} == original
    assert member_pids(shrunk) == original
    report = job.report()
    assert [g["cause"] for g in report["generations"]] == ["start", "scale_out", "scale_in"]
    assert [g["world_size"] for g in report["generations"]] == [2, 4, 2]
    assert report["surviving_worker_pids_unchanged"]
    assert_exactly_once(report, EPOCHS)
    # the two workers that left did so gracefully: exit code 0
    exits = {e["worker_id"]: e["returncode"] for e in job.events() if e.get("event") == "worker_exit"}
    leavers = set(member_pids(grown)) - set(original)
    assert leavers and all(exits.get(w) == 0 for w in leavers), exits
    assert_same_params(reference_params, tmp_path / "p.pt")


def test_kill_9_worker_survivors_continue_losing_at_most_one_step(
    elastic_job, tmp_path, reference_params
) -> None:
    job = elastic_job(hosts(3), ["--min-np", "2", "--max-np", "3"], example(tmp_path / "p.pt"))
    gen = job.wait_world(3, 20)
    victim = gen["members"][-1]
    os.kill(victim["pid"], signal.SIGKILL)
    after = job.wait_world(2, 5)
    # the killed worker's host (its agent still there) is taken back before the job runs at full speed,
    # which would otherwise end it before a new worker (a process start, torch imported) could join
    job.wait_world(3, 1)
    full_speed(tmp_path)
    assert job.wait() == 0, job.output()

    survivors = {w: p for w, p in member_pids(gen).items() if w != victim["worker_id"]}
    assert member_pids(after) == survivors
    report = job.report()
    causes = [(g["cause"], g["world_size"]) for g in report["generations"]]
    failure = next(g for g in report["generations"] if g["cause"] == "worker_failure")
    assert failure["world_size"] == 2 and failure["steps_lost"] <= 1
    assert failure["samples_replayed"] <= 64  # at most the one step that was in flight
    # the killed worker's host (its agent still there) is taken back: the job grows to 3 again
    assert causes[-1] == ("scale_out", 3), causes
    assert_exactly_once(report, EPOCHS)
    assert_same_params(reference_params, tmp_path / "p.pt")


def test_sigterm_worker_leaves_gracefully(elastic_job, tmp_path, reference_params) -> None:
    job = elastic_job(hosts(3), ["--min-np", "2", "--max-np", "3"], example(tmp_path / "p.pt"))
    gen = job.wait_world(3, 20)
    leaver = gen["members"][0]
    os.kill(leaver["pid"], signal.SIGTERM)
    job.wait_world(2, 5)
    full_speed(tmp_path)
    assert job.wait() == 0, job.output()
    report = job.report()
    assert report["generations"][-1]["cause"] == "scale_in"
    assert report["generations"][-1]["steps_lost"] == 0
    exits = {e["worker_id"]: e["returncode"] for e in job.events() if e.get("event") == "worker_exit"}
    assert exits[leaver["worker_id"]] == 0
    assert_exactly_once(report, EPOCHS)
    assert_same_params(reference_params, tmp_path / "p.pt")


def test_fixed_batch_trajectory_2_4_3_2_matches_constant_world(
    elastic_job, tmp_path, reference_params
) -> None:
    """2 -> 4 -> 3 -> 2 ends with the same parameters as a constant 2-worker run (float64)."""
    job = elastic_job(
        hosts(2), ["--min-np", "2", "--max-np", "4", "--join-grace", "20"], example(tmp_path / "p.pt")
    )
    job.wait_world(2, 10)
    job.set_hosts(hosts(4))
    gen = job.wait_world(4, 10)
    os.kill(gen["members"][-1]["pid"], signal.SIGKILL)
    job.wait_world(3, 10)
    job.set_hosts(hosts(2))
    job.wait_world(2, 1)
    full_speed(tmp_path)
    assert job.wait() == 0, job.output()
    report = job.report()
    assert [g["world_size"] for g in report["generations"]] == [2, 4, 3, 2]
    assert_exactly_once(report, EPOCHS)
    assert_same_params(reference_params, tmp_path / "p.pt")
