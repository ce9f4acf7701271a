"""`elastrain run --tensorboard-dir` and `elastrain.report()` for real: event files read back with
TensorBoard's own reader across a resize (native and restart mode), and a torchrun-style job's
figures, world size and incidents in the control plane's job metrics."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from elastrain.testing.clusters import all_running
from elastrain.testing.jobs import EXAMPLE, ElasticJob, hosts
from elastrain.testing.server import ControlPlane
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(240)

# torchrun-style: RANK/WORLD_SIZE from the environment, its own checkpoint, and only `report` of elastrain
TORCHRUN_STYLE = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from elastrain import report

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    state, go_on = Path(sys.argv[1]), Path(sys.argv[2])
    step = int(state.read_text()) if state.exists() else 0
    while go_on.exists() or step < int(sys.argv[3]):
        time.sleep(0.05)
        step += 1
        if rank == 0:  # atomically: a rank starting now reads it
            state.with_suffix(".tmp").write_text(str(step))
            state.with_suffix(".tmp").replace(state)
        report(loss=1.0 / step, step=step, accuracy=min(1.0, step / 100))
    print(f"rank {rank} of {world} done at step {step}", flush=True)
    """
)


def scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar under `log_dir` as TensorBoard reads it: tag -> [(step, value), ...]."""
    files = list(log_dir.glob("events.out.tfevents.*"))
    assert len(files) == 1, f"one writer, one event file: {files}"
    events = EventAccumulator(str(log_dir), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def values(found: dict[str, list[tuple[int, float]]], tag: str) -> list[float]:
    return [value for _step, value in found[tag]]


def test_native_run_writes_loss_throughput_and_world_size_across_a_resize(
    elastic_job: Callable[..., ElasticJob], tmp_path: Path
) -> None:
    board = tmp_path / "board"
    slow = tmp_path / "slow"
    slow.touch()
    # slow (0.05 s a step, 940 steps) until the resize is done, then full speed to the end
    command = ["python", str(EXAMPLE), "--epochs", "6", "--step-sleep", "0.05", "--slow-while", str(slow)]
    run_args = ["--min-np", "1", "--max-np", "2", "--join-grace", "1", "--tensorboard-dir", str(board)]
    job = elastic_job(hosts(1), run_args, command)
    job.wait_world(1, 40)
    job.set_hosts(hosts(2))
    job.wait_world(2, 40)
    slow.unlink()
    assert job.wait() == 0, job.output()

    found = scalars(board)
    assert {"loss", "samples_per_s", "world_size", "resize/world_size", "resize/steps_lost"} <= set(found)
    assert {"resize/pause_s", "resize/detect_s", "job/incidents"} <= set(found)
    assert set(values(found, "world_size")) == {1.0, 2.0}
    assert values(found, "resize/world_size") == [1.0, 2.0]
    assert values(found, "job/incidents") == [0.0, 1.0]  # the start, then one scale-out
    assert all(math.isfinite(v) and v > 0 for v in values(found, "loss"))
    assert max(values(found, "samples_per_s")) > 0
    steps = [step for step, _ in found["loss"]]
    assert steps == sorted(steps) and steps[-1] > 80
    pause = values(found, "resize/pause_s")
    assert len(pause) == 2 and all(0 <= p < 60 for p in pause)


def test_restart_mode_script_gets_world_size_restarts_and_its_reported_figures(
    elastic_job: Callable[..., ElasticJob], tmp_path: Path
) -> None:
    board = tmp_path / "board"
    script = tmp_path / "torchrun_style.py"
    script.write_text(TORCHRUN_STYLE)
    state, go_on = tmp_path / "step", tmp_path / "go_on"
    go_on.touch()
    run_args = ["--min-np", "1", "--max-np", "2", "--join-grace", "1", "--tensorboard-dir", str(board)]
    job = elastic_job(hosts(1), run_args, ["python", str(script), str(state), str(go_on), "10"])

    def step() -> int:
        try:
            return int(state.read_text() or 0)
        except (OSError, ValueError):
            return 0

    job.watcher.wait("20 steps at world size 1", lambda: step() >= 20, 120)
    job.set_hosts(hosts(2))
    job.watcher.wait(
        "a generation of 2", lambda: any(g["world_size"] == 2 for g in job.watcher.generations()), 120
    )
    resized_at = step()
    job.watcher.wait("rank 0 to go on after the restart", lambda: step() >= resized_at + 30, 120)
    go_on.unlink()
    assert job.wait() == 0, job.output()
    assert "rank 1 of 2 done" in job.output()

    found = scalars(board)
    assert {"loss", "accuracy", "world_size", "job/restarts", "job/incidents", "resize/world_size"} <= set(
        found
    )
    assert set(values(found, "world_size")) == {1.0, 2.0}  # the launcher's, and WORLD_SIZE with each report
    assert values(found, "resize/world_size") == [1.0, 2.0]
    assert values(found, "job/restarts")[-1] == 1.0
    assert values(found, "job/incidents")[-1] == 1.0
    reported = dict(found["loss"])
    assert reported and all(abs(value - 1.0 / s) < 1e-6 for s, value in reported.items())
    assert max(reported) >= resized_at + 30  # the restarted rank 0 reported too


def test_report_in_a_torchrun_style_job_reaches_the_job_metrics_and_tensorboard(cp: ControlPlane) -> None:
    board = cp.mounts / "board"
    board.mkdir(exist_ok=True)
    script = textwrap.dedent(
        """
        import os, time
        from elastrain import report
        for step in range(1, 31):
            time.sleep(0.1)
            report(loss=1.0 / step, step=step, accuracy=step / 30)
        print("rank", os.environ["RANK"], "done", flush=True)
        """
    )
    command = ["elastrain", "run", "--standalone", "--nproc-per-node", "2", "python", "-c", script]
    with cp.client() as c, cp.http() as http:
        c.create_cluster("reporting", containers=2, mounts=[f"{board}:/board"])
        c.wait_cluster("reporting", all_running)
        bad = http.post("/clusters/reporting/jobs", json={"command": ["true"], "tensorboard_dir": "tb"})
        assert bad.status_code == 422 and "absolute path" in bad.text, bad.text
        response = http.post(
            "/clusters/reporting/jobs", json={"command": command, "tensorboard_dir": "/board/run1"}
        )
        assert response.status_code == 201, response.text
        job = response.json()
        assert job["tensorboard_dir"] == "/board/run1"
        done = wait_until(lambda: (j := c.get_job(job["id"]))["status"] != "Running" and j, 120, "the job")
        log = c.job_logs(job["id"])[0]
        assert done["exit_code"] == 0, log

        rows = http.get(f"/jobs/{job['id']}/metrics").json()
        reported = [r for r in rows if r["loss"] is not None]
        assert reported and reported[-1]["step"] == 30 and reported[-1]["loss"] == pytest.approx(1 / 30), rows
        assert reported[-1]["scalars"] == {"accuracy": pytest.approx(1.0)}
        assert len(reported) < 30  # batched: at most one report a second
        assert any(r["world_size"] == 2 and r["loss"] is None for r in rows)  # from the launcher
        assert done["world_size"] == 2
        incidents = [e["detail"] for e in c.job_events(job["id"]) if e["action"] == "job.incident"]
        assert [(i["cause"], i["world_size"], i["restarted"]) for i in incidents] == [("start", 2, False)]
        assert "loss" in scalars(board / "run1")
        c.delete_cluster("reporting")
        c.wait_deleted("reporting")
