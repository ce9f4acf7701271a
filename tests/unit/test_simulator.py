"""Trace simulator: hand-computable runs, trace validation with line numbers, the CLI, the model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from elastrain.cli.main import main
from elastrain.errors import ConfigError
from elastrain.scheduler import throughput
from elastrain.scheduler.api import Job, Policy
from elastrain.scheduler.metrics import METRIC_KEYS, format_table, percentile, summarize
from elastrain.scheduler.registry import make_policy
from elastrain.scheduler.simulator import SimConfig, model_for, simulate, to_job
from elastrain.scheduler.tiresias import TiresiasPolicy
from elastrain.scheduler.trace import TraceJob, read_trace, repeat_trace, scale_arrivals

HEADER = "job_id,submit_time_s,num_gpus,duration_s,vc\n"


def write(tmp_path: Path, body: str, header: str = HEADER) -> Path:
    path = tmp_path / "trace.csv"
    path.write_text(header + body)
    return path


def run(jobs: list[TraceJob], policy: str | Policy, gpus: int, **kw) -> dict:
    pol = make_policy(policy) if isinstance(policy, str) else policy
    res = simulate(jobs, pol, SimConfig(gpus=gpus, **kw))
    return {"res": res, **summarize(res)}


TINY = [TraceJob("a", 0, 2, 100), TraceJob("b", 10, 1, 50), TraceJob("c", 20, 1, 30)]


def test_static_tiny_trace_is_hand_computable() -> None:
    # 2 GPUs: a holds both 0..100; then b 100..150 and c 100..130
    out = run(TINY, "static", 2)
    res = out["res"]
    assert sorted(res.jct_s) == pytest.approx([100, 110, 140])
    assert out["avg_jct_s"] == pytest.approx(350 / 3)
    assert out["avg_queue_s"] == pytest.approx((0 + 90 + 80) / 3)
    assert out["makespan_s"] == pytest.approx(150)
    assert out["gpu_utilization"] == pytest.approx(280 / 300)
    assert out["useful_utilization"] == pytest.approx(280 / 300)  # a static gang on one node: all useful
    assert out["total_wait_s"] == pytest.approx(170) and out["avg_wait_s"] == pytest.approx(170 / 3)
    assert out["p50_jct_s"] == pytest.approx(110)
    # b (50 s) ends at 150 after submitting at 10: JCT 140; c (30 s) ends at 130 from 20: JCT 110
    assert out["avg_slowdown"] == pytest.approx((100 / 100 + 140 / 50 + 110 / 30) / 3)
    assert out["jobs"] == 3
    assert out["p99_jct_s"] == pytest.approx(percentile([100, 110, 140], 99))
    assert res.series_gpus[0] == 2 and max(res.series_queue) == 2


def test_static_without_contention_runs_every_job_for_its_duration() -> None:
    jobs = [TraceJob(f"j{i}", i * 7.0, 1 + i % 2, 40.0 + i) for i in range(6)]
    res = run(jobs, "static", 64)["res"]
    assert sorted(res.jct_s) == pytest.approx(sorted(j.duration_s for j in jobs))
    assert res.queue_s == [0.0] * 6


def test_elastic_grows_a_lone_job_and_finishes_it_sooner() -> None:
    job = TraceJob("solo", 0, 1, 1000.0)
    model = model_for("solo")
    res = run([job], "elastic", 8, restart_cost_s=0.0)["res"]
    # min 1, max 8 (one node by default): 1000 s of work at speedup(8 GPUs, 1 node)/speedup(1)
    assert res.jct_s == pytest.approx([1000.0 / throughput.speedup(model, 8, 1)])
    assert res.resizes == 0  # started at its final size in one decision


def test_elastic_shrinks_to_admit_and_loses_no_work() -> None:
    jobs = [TraceJob("big", 0, 2, 1000.0), TraceJob("small", 100, 1, 100.0)]
    out = run(jobs, "elastic", 4, restart_cost_s=0.0)
    res = out["res"]
    assert out["jobs"] == 2 and res.resizes >= 1
    assert out["gpu_utilization"] <= 1.0 + 1e-9


def test_tiresias_preempts_and_resumes() -> None:
    jobs = [TraceJob("long", 0, 2, 20000.0), TraceJob("short", 5000, 1, 100.0)]
    res = run(jobs, TiresiasPolicy(thresholds=(3600.0,)), 2, restart_cost_s=0.0)["res"]
    assert res.preemptions == 1
    # long has 10,000 GPU-s (queue 1 above 3,600) when short arrives: short preempts it and runs 100 s
    assert sorted(res.jct_s)[0] == pytest.approx(100.0)
    assert max(res.jct_s) == pytest.approx(20100.0)


def test_all_policies_agree_on_total_work_under_no_contention() -> None:
    for name in ("static", "static-backfill", "elastic", "tiresias"):
        out = run(TINY, name, 64)
        assert out["jobs"] == 3


def test_job_larger_than_the_cluster_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"job a \(trace line 0\) needs 2 GPUs"):
        run(TINY, "static", 1)


def test_to_job_bounds() -> None:
    # no bounds in the trace: min 1 GPU (data parallel), max = the larger of its size and one node
    j = to_job(TraceJob("x", 0, 8, 10), 64)
    assert (j.min_workers, j.requested, j.max_workers) == (1, 8, 8)
    j = to_job(TraceJob("y", 0, 1, 10), 64)
    assert (j.min_workers, j.requested, j.max_workers) == (1, 1, 8)
    assert to_job(TraceJob("y", 0, 1, 10), 64, gpus_per_node=4).max_workers == 4
    assert to_job(TraceJob("y", 0, 1, 10), 64, max_gpus_default=32).max_workers == 32
    assert to_job(TraceJob("z", 0, 16, 10), 20).max_workers == 16
    assert to_job(TraceJob("s", 0, 2, 10), 4).max_workers == 4  # capped by the cluster
    # the trace's own bounds win
    j = to_job(TraceJob("b", 0, 4, 10, min_gpus=2, max_gpus=12), 64)
    assert (j.min_workers, j.requested, j.max_workers) == (2, 4, 12)
    assert model_for("philly-00001") == model_for("philly-00001") in throughput.model_names()


# ------------------------------------------------------------------ traces


def test_read_trace_reads_optional_bounds(tmp_path: Path) -> None:
    path = write(
        tmp_path, "a,0,2,10,1,8\nb,1,1,5,,\n", "job_id,submit_time_s,num_gpus,duration_s,min_gpus,max_gpus\n"
    )
    assert [(j.min_gpus, j.max_gpus) for j in read_trace(path)] == [(1, 8), (0, 0)]


def test_read_trace_sorts_and_ignores_extra_columns(tmp_path: Path) -> None:
    path = write(tmp_path, "b,20,1,5,vc1\na,10,2,7.5,vc2\n")
    jobs = read_trace(path)
    assert [(j.job_id, j.submit_s, j.num_gpus, j.duration_s, j.line) for j in jobs] == [
        ("a", 10.0, 2, 7.5, 3),
        ("b", 20.0, 1, 5.0, 2),
    ]


@pytest.mark.parametrize(
    ("header", "body", "message"),
    [
        ("job_id,submit_time_s,num_gpus\n", "a,1,1\n", r"line 1: missing column\(s\) duration_s"),
        (HEADER, "a,0,1,10,x\nb,5,1,abc,x\n", r"line 3: duration_s 'abc' is not a number"),
        (HEADER, "a,0,1,10,x\nb,5,1,10,x\nc,6,1,-3,x\n", r"line 4: duration_s '-3' must be a finite"),
        (HEADER, "a,0,1.5,10,x\n", r"line 2: num_gpus '1.5' must be a whole number"),
        (HEADER, "a,0,0,10,x\n", r"line 2: num_gpus '0'"),
        (HEADER, "a,nan,1,10,x\n", r"line 2: submit_time_s 'nan' must be a finite"),
        (HEADER, "a,0,1,10,x\n,1,1,1,x\n", r"line 3: empty job_id"),
        (HEADER, "a,0,1,10,x\nb,1,1\n", r"line 3: empty duration_s"),
        (HEADER, "a,0,1,10,x\na,1,1,1,x\n", r"line 3: duplicate job_id 'a'"),
        (HEADER, "", r"no jobs"),
        ("job_id,submit_time_s,num_gpus,duration_s,min_gpus\n", "a,0,2,10,3\n", r"line 2: need min_gpus"),
        ("job_id,submit_time_s,num_gpus,duration_s,max_gpus\n", "a,0,2,10,x\n", r"line 2: max_gpus 'x'"),
    ],
)
def test_malformed_traces_name_the_line(tmp_path: Path, header: str, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        read_trace(write(tmp_path, body, header))
    assert "\n" not in str(info.value)


def test_missing_trace_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read trace"):
        read_trace(tmp_path / "nope.csv")


def test_repeat_trace_shifts_copies_by_whole_hours() -> None:
    jobs = [TraceJob("a", 0, 1, 5), TraceJob("b", 5000, 1, 5)]
    out = repeat_trace(jobs, 3)
    assert [(j.job_id, j.submit_s) for j in out] == [
        ("a", 0),
        ("b", 5000),
        ("a#1", 7200),
        ("b#1", 12200),
        ("a#2", 14400),
        ("b#2", 19400),
    ]
    with pytest.raises(ConfigError):
        repeat_trace(jobs, 0)


def test_scale_arrivals_compresses_or_stretches_submit_times_from_the_first() -> None:
    jobs = [TraceJob("a", 100, 1, 5), TraceJob("b", 300, 2, 7)]
    assert [(j.job_id, j.submit_s, j.duration_s) for j in scale_arrivals(jobs, 2)] == [
        ("a", 100, 5),
        ("b", 200, 7),
    ]
    assert [j.submit_s for j in scale_arrivals(jobs, 0.5)] == [100, 500]
    with pytest.raises(ConfigError, match="arrival rate"):
        scale_arrivals(jobs, 0)


# ------------------------------------------------------------------ CLI


def test_cli_compare_writes_json_and_plot(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    body = "".join(f"j{i},{i * 30},{1 + i % 3},{200 + 13 * i},x\n" for i in range(40))
    trace = write(tmp_path, body)
    out_json, out_png = tmp_path / "m.json", tmp_path / "p.png"
    argv = [
        "simulate",
        "--trace",
        str(trace),
        "--gpus",
        "4",
        "--compare",
        "static,static-backfill,elastic,tiresias",
    ]
    rc = main([*argv, "--json", str(out_json), "--plot", str(out_png)])
    cap = capsys.readouterr()
    assert rc == 0
    data = json.loads(out_json.read_text())
    assert list(data) == ["static", "static-backfill", "elastic", "tiresias"]
    for metrics in data.values():
        assert set(metrics) == set(METRIC_KEYS)
        assert {"avg_jct_s", "p99_jct_s", "makespan_s", "gpu_utilization"} <= set(metrics)
        assert metrics["jobs"] == 40 and 0 < metrics["gpu_utilization"] <= 1
    assert "avg JCT ratio: static/tiresias" in cap.out and "elastic/tiresias" in cap.out
    assert "100.0%" in cap.err  # progress bar
    assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_cli_bad_trace_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = write(tmp_path, "a,0,1,-5,x\n")
    assert main(["simulate", "--trace", str(trace), "--gpus", "4", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "line 2" in err and "duration_s" in err
    assert main(["simulate", "--trace", str(trace), "--gpus", "4", "--policy", "fifo"]) == 2
    assert "unknown policy 'fifo'" in capsys.readouterr().err


def test_format_table_lists_policies() -> None:
    results = [run(TINY, p, 2)["res"] for p in ("static", "elastic")]
    table = format_table(results)
    assert table.splitlines()[0].startswith("policy") and "elastic/static" in table


# ------------------------------------------------------------------ throughput model


def test_speedup_curves_are_sane() -> None:
    for model in throughput.model_names():
        assert throughput.speedup(model, 1) == pytest.approx(1.0)
        assert 1.0 < throughput.speedup(model, 16) < 16.0
    assert throughput.speedup("unknown", 0) == 0.0
    assert throughput.speedup("unknown", 4) > 1.0


def test_measured_throughput_overrides_the_model() -> None:
    job = Job("m", 1, 8, model="cifar10", throughput=((2, 300.0),))
    assert throughput.job_speed(job, 2) == 300.0
    ratio = throughput.speedup("cifar10", 4) / throughput.speedup("cifar10", 2)
    assert throughput.job_speed(job, 4) == pytest.approx(300.0 * ratio)
    assert throughput.job_speed(job, 0) == 0.0


def test_refit_recovers_known_parameters(tmp_path: Path) -> None:
    truth = {"a_c": 0.05, "b_c": 0.002, "a_r": 0.02, "b_r": 0.001, "a_n": 0.1, "b_n": 0.004, "g": 2.0}
    rows = ["model,source,placement,num_nodes,num_replicas,local_bsz,step_time_s,sync_time_s"]
    for k in (1, 2, 3, 4, 8, 16, 32):
        nodes = -(-k // 4)
        for m in (16, 32, 64, 128):
            t = throughput.step_time({**truth, "m_ref": m}, k, m, nodes)
            rows.append(f"toy,placements,,{nodes},{k},{m},{t},0")
    csv_path, out = tmp_path / "st.csv", tmp_path / "params.py"
    csv_path.write_text("\n".join(rows) + "\n")
    fitted = throughput.refit(csv_path, out)["toy"]
    assert fitted["log_rmse"] < 1e-3 and fitted["g"] == pytest.approx(2.0, rel=0.05)
    assert "GENERATED" in out.read_text()
