"""`elastrain.report()`: a no-op outside elastrain, rank 0 only, batched and rate-limited, never raising;
the launcher's metrics relay it sends to; `--tensorboard-dir` and the API fields' validation."""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from elastrain.cli.main import main
from elastrain.errors import ConfigError
from elastrain.launcher.metrics_relay import MetricsRelay
from elastrain.launcher.tensorboard import check_tensorboard_dir
from elastrain.reporting import MAX_SCALARS, Reporter
from elastrain.runtime.progress import METRICS_URL_ENV, post_json, relay_endpoint
from elastrain.server.job_schemas import JobProgress, JobSubmit

TOKEN = "job-token"


class Received:
    """What a real `MetricsRelay` was sent: every batch, in order."""

    def __init__(self) -> None:
        self.batches: list[list[dict[str, Any]]] = []
        self.arrived = threading.Condition()

    def __call__(self, points: list[dict[str, Any]]) -> None:
        with self.arrived:
            self.batches.append(points)
            self.arrived.notify_all()

    def points(self) -> list[dict[str, Any]]:
        return [p for batch in self.batches for p in batch]

    def wait_points(self, count: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.points()) >= count, timeout)
        return self.points()


@pytest.fixture(autouse=True)
def no_runtime(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests are about a process without elastrain's runtime (rank and world size from the
    environment); an earlier test of the session may have left one in this process."""
    from elastrain.runtime import connection

    monkeypatch.setattr(connection, "_RUNTIME", None)


@pytest.fixture
def relay() -> Any:
    received = Received()
    server = MetricsRelay("127.0.0.1", TOKEN, received)
    yield server, received
    server.close()


def relay_env(server: MetricsRelay, **extra: str) -> dict[str, str]:
    return {METRICS_URL_ENV: server.url, "ELASTRAIN_JOB_TOKEN": TOKEN, **extra}


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_outside_elastrain_it_is_a_silent_no_op_with_one_debug_line() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ELASTRAIN_")}
    code = (
        "import logging, threading, elastrain\n"
        "logging.basicConfig(level=logging.DEBUG, format='LOG %(message)s')\n"
        "for i in range(3): elastrain.report(loss=0.5, step=i, accuracy=0.9)\n"
        "print('threads', threading.active_count())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30, check=True
    )
    assert "threads 1" in out.stdout  # nothing started
    assert out.stderr.count("LOG elastrain.report: not in an elastrain job") == 1, out.stderr
    assert "Traceback" not in out.stderr


def test_reports_are_batched_and_rate_limited(relay: Any) -> None:
    server, received = relay
    reporter = Reporter(relay_env(server, WORLD_SIZE="3"), interval_s=0.5)
    started = time.monotonic()
    for step in range(50):
        reporter.report({"loss": 1.0 / (step + 1), "step": step, "accuracy": step / 50})
    assert time.monotonic() - started < 0.2  # never waits for the network
    points = received.wait_points(50)
    assert [p["step"] for p in points] == list(range(50))  # every point, in order
    assert len(received.batches) <= 2  # the first point alone at most, then the rest together
    assert points[-1]["scalars"] == {"accuracy": 49 / 50}
    assert points[-1]["world_size"] == 3  # torchrun's WORLD_SIZE when the script did not give one
    time.sleep(0.1)
    reporter.report({"step": 50})  # within the interval: held back, then sent in the next batch
    assert len(received.wait_points(51)) == 51
    assert reporter.flush(1.0)


def test_only_rank_0_reports(relay: Any) -> None:
    server, received = relay
    other = Reporter(relay_env(server, RANK="1"), interval_s=0.05)
    other.report({"loss": 2.0, "step": 1})
    assert other.flush(1.0)
    first = Reporter(relay_env(server, RANK="0"), interval_s=0.05)
    first.report({"loss": 1.0, "step": 1})
    assert [p["loss"] for p in received.wait_points(1)] == [1.0]
    assert other.sent == 0


def test_invalid_values_are_dropped_with_one_warning_each(relay: Any, caplog: Any) -> None:
    server, received = relay
    reporter = Reporter(relay_env(server), interval_s=0.05)
    with caplog.at_level(logging.WARNING, "elastrain.report"):
        for _ in range(3):
            reporter.report({"loss": float("nan"), "step": -1, "note": "text", "flag": True, "ok": 2})
        many = {f"m{i}": i for i in range(MAX_SCALARS + 5)}
        reporter.report({"step": 7, **many})
    points = received.wait_points(4)
    assert points[0] == {"scalars": {"ok": 2.0}, "at": points[0]["at"]}
    assert len(points[3]["scalars"]) == MAX_SCALARS and points[3]["step"] == 7
    messages = [r.getMessage() for r in caplog.records]
    assert sum("loss=nan dropped" in m for m in messages) == 1
    assert sum("step must be a whole number" in m for m in messages) == 1
    assert sum("note='text' dropped" in m for m in messages) == 1
    assert sum(f"at most {MAX_SCALARS} other scalars" in m for m in messages) == 1


def test_an_unreachable_server_never_blocks_or_raises() -> None:
    env = {
        "ELASTRAIN_REPORT_URL": f"http://127.0.0.1:{closed_port()}",
        "ELASTRAIN_JOB_ID": "7",
        "ELASTRAIN_REPORT_TOKEN": "t",
    }
    reporter = Reporter(env, interval_s=0.05)
    started = time.monotonic()
    for step in range(100):
        reporter.report({"loss": 0.1, "step": step})
    assert time.monotonic() - started < 0.2
    assert reporter.flush(5.0)
    deadline = time.monotonic() + 5
    while reporter.sent == 0 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert reporter.sent >= 1  # tried, failed quietly


def test_relay_refuses_a_wrong_token_and_bad_bodies(relay: Any) -> None:
    server, received = relay
    url, token = relay_endpoint(relay_env(server))
    assert post_json(url, "not-the-token", {"points": [{"step": 1}]}) == 401
    assert post_json(url, token, {"no": "points"}) == 400
    assert post_json(url.replace("/points", "/other"), token, {"points": []}) == 404
    assert post_json(url, token, {"points": [{"step": 1, "loss": 0.5}]}) == 204
    assert received.points() == [{"step": 1, "loss": 0.5}]


def test_tensorboard_dir_is_created_or_refused_in_one_line(tmp_path: Path) -> None:
    made = check_tensorboard_dir(tmp_path / "a" / "b")
    assert made.is_dir() and made.is_absolute()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    with pytest.raises(ConfigError, match="is a file; give a directory"):
        check_tensorboard_dir(a_file)
    with pytest.raises(ConfigError, match="cannot write there"):
        check_tensorboard_dir(a_file / "below")
    if os.geteuid() != 0:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(ConfigError, match="cannot write there"):
            check_tensorboard_dir(locked)


def test_run_refuses_an_unusable_tensorboard_dir_before_starting(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    code = main(["run", "-np", "1", "-H", "127.0.0.1:1", "--tensorboard-dir", str(a_file), "echo", "hi"])
    err = capsys.readouterr().err
    assert code == 2
    expected = f"elastrain run: error: --tensorboard-dir {a_file} is a file; give a directory"
    assert err.strip().splitlines() == [expected]


def test_api_fields_are_validated() -> None:
    assert JobSubmit(command=["x"], tensorboard_dir="/data/tb").tensorboard_dir == "/data/tb"
    for bad in ("relative/dir", "", "/data/\x00"):
        with pytest.raises(ValidationError):
            JobSubmit(command=["x"], tensorboard_dir=bad)
    assert JobProgress(step=1, scalars={"eval/acc": 0.5}).scalars == {"eval/acc": 0.5}
    for scalars in ({"bad name": 1.0}, {"nan": float("nan")}, {f"s{i}": 1.0 for i in range(MAX_SCALARS + 1)}):
        with pytest.raises(ValidationError):
            JobProgress(scalars=scalars)


def test_a_script_that_only_reports_keeps_restart_mode() -> None:
    from elastrain.launcher.mode import uses_elastrain

    for code in ("from elastrain import report", "from elastrain.reporting import report as r  # metrics"):
        assert not uses_elastrain(["python", "-c", f"import os\n{code}\nr = 1\n"]), code
    for code in ("import elastrain", "from elastrain import report, init", "from elastrain import State"):
        assert uses_elastrain(["python", "-c", f"{code}\n"]), code


def test_the_jobs_tensorboard_dir_is_the_default_and_named_when_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("x")
    monkeypatch.setenv("ELASTRAIN_TENSORBOARD_DIR", str(a_file))
    assert main(["run", "-np", "1", "-H", "127.0.0.1:1", "echo", "hi"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"elastrain run: error: the job's tensorboard_dir (ELASTRAIN_TENSORBOARD_DIR) {a_file} is a file; "
        "give a directory"
    ]
