"""Pollux benchmark mode: the goodput model by hand, the measurements against their CSV rows, the list
reader's errors, invariants of small benchmark simulations, and the CLI.

The data is a tiny excerpt of the Pollux measurements (``pollux_tiny/``: cifar10 and ncf rows of
``../shared/traces/pollux_throughput``), so nothing here needs the shared folder.
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path

import pytest

from elastrain.cli.main import main
from elastrain.errors import ConfigError
from elastrain.scheduler import benchsim
from elastrain.scheduler.api import ClusterState, Decision, Policy, check_consistency
from elastrain.scheduler.benchmark import LIST_COLUMNS, load_applications, read_benchmark
from elastrain.scheduler.benchreport import mean_summary
from elastrain.scheduler.goodput import (
    GoodputModel,
    GoodputSpeed,
    GradParams,
    JobGoodput,
    PerfParams,
    fixed_batch_config,
    gain,
    iteration_time,
)
from elastrain.scheduler.metrics import METRIC_KEYS
from elastrain.scheduler.simulator import SimConfig

pytest.importorskip("scipy")

DATA = Path(__file__).with_name("pollux_tiny")
LIST = DATA / "list.csv"
PERF = PerfParams(alpha_c=0.1, beta_c=0.01, alpha_n=0.5, beta_n=0.1, alpha_r=0.2, beta_r=0.05, gamma=1.0)
GRAD = GradParams(sqr=1.0, var=3.0)


def rows(name: str) -> list[dict[str, str]]:
    with (DATA / name).open() as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def apps() -> dict:
    return load_applications(DATA)


# ------------------------------------------------------------------ goodput model by hand


def test_goodput_model_hand_computed() -> None:
    model = GoodputModel(PERF, GRAD, init_batch_size=10)
    # 4 GPUs on one node, m = 10, no accumulation: T_compute 0.2, T_sync 0.2 + 0.05 * 2 = 0.3, gamma 1
    assert iteration_time(PERF, 1, 4, 10, 0) == pytest.approx(0.5)
    assert model.throughput(1, 4, 10, 0) == pytest.approx(40 / 0.5)
    # M = 40 = 4 M0: gain (3 + 1) / (3 / 4 + 1), efficiency gain / 4
    assert gain(GRAD, 40, 10) == pytest.approx(4 / 1.75)
    assert model.goodput(1, 4, 10, 0) == pytest.approx(80 * (4 / 1.75) / 4)
    # one accumulation step: T_iter = T_compute + T_step = 0.7, M = 80
    assert model.goodput(1, 4, 10, 1) == pytest.approx(80 / 0.7 * (4 / (3 / 8 + 1)) / 8)
    # across nodes: T_sync = 0.5 + 0.1 * 2
    assert iteration_time(PERF, 2, 4, 10, 0) == pytest.approx(0.2 + 0.7)
    # gamma 2: T_step = sqrt(0.2^2 + 0.3^2); one GPU has no sync at all
    p2 = PerfParams(0.1, 0.01, 0.5, 0.1, 0.2, 0.05, 2.0)
    assert iteration_time(p2, 1, 4, 10, 0) == pytest.approx(math.hypot(0.2, 0.3))
    assert iteration_time(p2, 1, 1, 10, 2) == pytest.approx(3 * 0.2)
    # at the reference batch the efficiency is 1: goodput = throughput
    assert model.goodput(1, 1, 10, 0) == pytest.approx(model.throughput(1, 1, 10, 0))


def test_optimize_is_the_best_valid_candidate() -> None:
    model = GoodputModel(PERF, GRAD, init_batch_size=10)
    best = model.optimize(1, 4, max_batch_size=400, local_bsz_range=(5, 30))
    assert 5 <= best.atomic_bsz <= 30 and best.goodput > 0
    assert best.goodput == pytest.approx(model.goodput(1, 4, best.atomic_bsz, best.accum_steps))
    for atomic in range(5, 31):
        for accum in range(0, 3):
            if 10 <= 4 * atomic * (accum + 1) <= 400:
                assert model.goodput(1, 4, atomic, accum) <= best.goodput * 1.06  # 50 geometric candidates
    # on one GPU above M0 the batch is split in at least two micro-batches (as Pollux)
    one = model.optimize(1, 1, max_batch_size=400, local_bsz_range=(5, 300))
    assert one.batch_size(1) <= 10 or one.accum_steps >= 1
    assert model.optimize(1, 64, max_batch_size=100, local_bsz_range=(5, 30)).goodput == 0.0  # 64 x 5 > 100


def test_fixed_batch_split_as_the_artifact() -> None:
    # cifar10 4096 on 12 GPUs: 342 per GPU, capped to 4096 // 12 = 341
    assert fixed_batch_config(4096, 12, 128, 1024, 4096) == (341, 0)
    # 512 on one GPU of at most 257: two micro-batches of 256
    assert fixed_batch_config(512, 1, 128, 257, 512) == (256, 1)
    # above M0 on one GPU: always at least one accumulation step
    assert fixed_batch_config(256, 1, 128, 1024, 4096) == (128, 1)


def test_goodput_speed_plugs_into_a_policy() -> None:
    from elastrain.scheduler.api import Job

    speed = GoodputSpeed()
    job = Job("a", 1, 8)
    speed.set("a", JobGoodput(GoodputModel(PERF, GRAD, 10), 400, (5, 30)))
    assert speed(job, 4, 1) == pytest.approx(speed.config("a", 4, 1).goodput) and speed(job, 0, 0) == 0.0
    fixed = JobGoodput(GoodputModel(PERF, GRAD, 10), 400, (5, 30), fixed_batch=40)
    speed.set("a", fixed)
    assert speed(job, 4, 1) == pytest.approx(GoodputModel(PERF, GRAD, 10).goodput(1, 4, 10, 0))
    assert speed(Job("other", 1, 8), 2, 1) > 0  # unregistered: the step-time model


def test_restart_penalty_as_pollux() -> None:
    from elastrain.scheduler.api import Job

    speed = GoodputSpeed(restart_penalty_s=30.0)
    speed.set("a", JobGoodput(GoodputModel(PERF, GRAD, 10), 400, (5, 30)))
    running = Job("a", 1, 8, placement=(("n0", 2),), arrival_s=0.0)
    speed.now_s = 120.0
    speed.restarted("a")
    plain = speed.config("a", 4, 1).goodput
    assert speed(running, 4, 1) == pytest.approx(plain * (120 - 30) / (120 + 30))
    assert speed(running, 2, 1) == pytest.approx(speed.config("a", 2, 1).goodput)  # current: no penalty
    assert speed(Job("a", 1, 8), 4, 1) == pytest.approx(plain)  # queued: starting costs the same anyway


# ------------------------------------------------------------------ measurements vs CSV rows


def test_step_times_match_rows_and_interpolate(apps: dict) -> None:
    cifar = apps["cifar10"]
    by = {
        (r["placement"], int(r["local_bsz"])): (float(r["step_time_s"]), float(r["sync_time_s"]))
        for r in rows("step_times.csv")
        if r["model"] == "cifar10"
    }
    assert cifar.step_time((1,), 64) == pytest.approx(by[("1", 64)])
    mid = cifar.step_time((2, 2), (45 + 64) / 2)
    assert mid == pytest.approx([(a + b) / 2 for a, b in zip(by[("22", 45)], by[("22", 64)])])
    assert cifar.step_time((2, 1), 91) == pytest.approx(by[("12", 91)])  # up to rotation
    assert (cifar.min_local_bsz, cifar.max_local_bsz) == (32, 257)
    assert (cifar.init_batch_size, cifar.max_batch_size, cifar.max_epochs) == (128, 512, 3)


def test_grad_stats_and_progress_match_rows(apps: dict) -> None:
    cifar = apps["cifar10"]
    g = {
        (int(r["batch_size"]), i % 3): r
        for i, r in enumerate(r for r in rows("grad_stats.csv") if r["model"] == "cifar10")
    }
    r0 = g[(128, 0)]
    assert cifar.grad_stats(128, 0) == GradParams(float(r0["grad_sqr"]), float(r0["grad_var"]))
    lo, hi = g[(128, 1)], g[(256, 1)]
    mid = cifar.grad_stats(192, 1)
    assert mid.sqr == pytest.approx((float(lo["grad_sqr"]) + float(hi["grad_sqr"])) / 2)
    assert mid.var == pytest.approx((float(lo["grad_var"]) + float(hi["grad_var"])) / 2)
    assert cifar.progress(0) == 0.0
    assert cifar.progress(2) == pytest.approx(min(float(g[(b, 1)]["progress"]) for b in (128, 256, 512)))


# ------------------------------------------------------------------ list reader


@pytest.mark.parametrize(
    ("body", "set_name", "workload", "message"),
    [
        ("set,workload,job_id\n", "tiny", "all", "missing column(s) submit_time_s"),
        (None, "nope", "all", "no set 'nope'"),
        (None, "tiny", "w-9", "no workload 'w-9' (--workload; choose from w-1, w-2 or all)"),
        (
            ",".join(LIST_COLUMNS) + "\ntiny,w-1,a,x,cifar10,1,128\n",
            "tiny",
            "all",
            "line 2: submit_time_s 'x'",
        ),
        (",".join(LIST_COLUMNS) + "\ntiny,w-1,a,0,cifar10,0,128\n", "tiny", "all", "num_gpus '0'"),
        (
            ",".join(LIST_COLUMNS) + "\ntiny,w-1,a,0,cifar10,1,128\ntiny,w-1,a,5,ncf,1,1\n",
            "tiny",
            "all",
            "duplicate job_id",
        ),
    ],
)
def test_list_errors_name_the_problem(tmp_path: Path, body, set_name, workload, message) -> None:
    path = LIST
    if body is not None:
        path = tmp_path / "list.csv"
        path.write_text(body)
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        read_benchmark(path, set_name, workload)


def test_list_reader_and_app_errors(tmp_path: Path) -> None:
    lists = read_benchmark(LIST, None, "all")  # the only set
    assert list(lists) == ["w-1", "w-2"] and [j.job_id for j in lists["w-1"]][:2] == ["c0", "c1"]
    with pytest.raises(ConfigError, match="cannot read benchmark list"):
        read_benchmark(tmp_path / "missing.csv", "tiny", "all")
    with pytest.raises(ConfigError, match=r"no measurements for application.*bert.*known: cifar10, ncf"):
        load_applications(DATA, {"bert", "ncf"})
    with pytest.raises(ConfigError, match="--app-data"):
        load_applications(tmp_path)


# ------------------------------------------------------------------ small simulations


class Checking(Policy):
    """Delegates to a policy and checks every state it is shown (no GPU double-booked)."""

    def __init__(self, inner: Policy) -> None:
        self.inner, self.name, self.states = inner, inner.name, 0

    def decide(self, state: ClusterState) -> list[Decision]:
        check_consistency(state)
        assert state.free_gpus >= 0 and sum(j.gpus for j in state.running) <= state.total_gpus
        self.states += 1
        return self.inner.decide(state)

    def next_wakeup_s(self, state: ClusterState) -> float | None:
        return self.inner.next_wakeup_s(state)


@pytest.mark.parametrize("policy", ["static", "static-backfill", "tiresias", "elastic"])
def test_small_benchmark_invariants(apps: dict, policy: str, monkeypatch: pytest.MonkeyPatch) -> None:
    made: list[Checking] = []
    orig = benchsim.benchmark_policy

    def checking(name: str, speed: GoodputSpeed, thr: float | None = None) -> Policy:
        made.append(Checking(orig(name, speed, thr)))
        return made[-1]

    monkeypatch.setattr(benchsim, "benchmark_policy", checking)
    jobs = read_benchmark(LIST, "tiny", "w-1")["w-1"]
    res = benchsim.simulate_benchmark(jobs, apps, policy, SimConfig(gpus=4, gpus_per_node=2))
    assert len(res.jct_s) == len(jobs) and made[0].states > 0  # every job ended after its epochs
    assert max(res.series_gpus) <= 4
    for jct, iso in zip(res.jct_s, res.duration_s):
        assert jct > 30  # at least the first allocation's delay
        assert iso > 0
    if policy != "elastic":  # fixed batches: never faster than alone at the list size plus one restart
        assert all(j >= iso + 30 - 1e-6 for j, iso in zip(res.jct_s, res.duration_s))
    summary = mean_summary([res])
    assert set(METRIC_KEYS) <= set(summary) and summary["jobs"] == len(jobs)


def test_lone_job_runs_its_epochs_exactly(apps: dict) -> None:
    # seen at the first grid point (60 s), 30 s of start-up, then its isolated run time: work conserved
    jobs = read_benchmark(LIST, "tiny", "w-1")["w-1"][:1]
    iso = benchsim.isolated_run_s(jobs[0], apps["cifar10"], 2)
    for policy in ("tiresias", "static"):
        res = benchsim.simulate_benchmark(jobs, apps, policy, SimConfig(gpus=4, gpus_per_node=2))
        assert res.jct_s == [pytest.approx(60 + 30 + iso)]
        assert res.stall_gpu_seconds == pytest.approx(2 * 30)
    # progress in epochs: the isolated time is the sum over epochs of epoch progress / rate
    cifar = apps["cifar10"]
    assert iso > cifar.progress(3) * cifar.step_time((2,), 128)[0] * 0.5


# ------------------------------------------------------------------ CLI


def run_cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    code = main(["simulate", *args, "--no-progress"])
    out, err = capsys.readouterr()
    return code, out, err


def test_cli_benchmark_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "out.json"
    code, out, _ = run_cli(
        capsys,
        "--benchmark",
        str(LIST),
        "--set",
        "tiny",
        "--gpus",
        "4",
        "--gpus-per-node",
        "2",
        "--app-data",
        str(DATA),
        "--compare",
        "tiresias,elastic",
        "--json",
        str(out_json),
    )
    assert code == 0 and "avg JCT ratio" in out
    payload = json.loads(out_json.read_text())
    assert set(payload) == {"tiresias", "elastic"}
    assert set(METRIC_KEYS) <= set(payload["elastic"]) and payload["elastic"]["workloads"] == 2


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--benchmark", "missing.csv"], "cannot read benchmark list missing.csv"),
        (["--benchmark", str(LIST), "--set", "x"], "no set 'x'"),
        (["--benchmark", str(LIST), "--workload", "w-7"], "no workload 'w-7'"),
        (
            ["--benchmark", str(LIST), "--app-data", "/nonexistent/no-such-dir"],
            "no measurements folder /nonexistent/no-such-dir",
        ),
        (["--benchmark", str(LIST), "--trace", str(LIST)], "either --trace CSV or --benchmark CSV"),
        (
            ["--benchmark", str(LIST), "--app-data", str(DATA), "--gpus", "1"],
            "needs 2 GPUs; the cluster has 1",
        ),
    ],
)
def test_cli_errors_are_one_line(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    full = ["--gpus", "4", *args] if "--gpus" not in args else args
    code, _, err = run_cli(capsys, *full)
    assert code == 2 and message in err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
