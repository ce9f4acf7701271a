"""The worker's contracts: environment variables, progress reports and ledger records keep their
wire format; the runtime's modules keep their layering (State holds state; no import cycles)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from elastrain.contracts.env import ENV_VERSION, ReportEnv, WorkerEnv, WorkerIdentity
from elastrain.contracts.ledger import LEDGER_VERSION, RecordKind
from elastrain.contracts.report import REPORT_VERSION, CheckpointReport, ProgressReport
from elastrain.runtime.context import LaunchContext
from elastrain.runtime.ledger import Ledger
from elastrain.runtime.progress import _job_endpoint

RUNTIME = Path(__file__).resolve().parents[2] / "elastrain" / "runtime"


def test_versions_are_declared() -> None:
    assert ENV_VERSION >= 1 and REPORT_VERSION >= 1 and LEDGER_VERSION >= 1


def test_env_names_are_the_variables_and_round_trip() -> None:
    assert all(name.value.startswith("ELASTRAIN_") for name in WorkerEnv)
    who = WorkerIdentity("10.0.0.1:29400", "secret", "h1/0", "10.0.0.2", 3)
    env = who.to_env()
    assert env == {
        "ELASTRAIN_COORDINATOR": "10.0.0.1:29400",
        "ELASTRAIN_JOB_TOKEN": "secret",
        "ELASTRAIN_WORKER_ID": "h1/0",
        "ELASTRAIN_HOST": "10.0.0.2",
        "ELASTRAIN_LOCAL_RANK": "3",
    }
    plain = {str(k): v for k, v in env.items()} | {"ELASTRAIN_CHECKPOINT_EVERY": "7"}
    assert WorkerIdentity.from_env(plain) == who
    context = LaunchContext.from_env(plain)
    assert context.managed and context.worker_id == "h1/0" and context.local_rank == 3
    assert context.checkpoint_every_steps == 7 and context.collective_timeout_s == 60.0
    assert not LaunchContext.from_env({}).managed


def test_report_endpoint_needs_all_three_variables() -> None:
    report = ReportEnv("http://cp:8000/", "12", "tok")
    assert _job_endpoint(report.to_env(), "progress") == ("http://cp:8000/api/v1/jobs/12/progress", "tok")
    assert _job_endpoint({WorkerEnv.REPORT_URL: "http://cp"}, "progress") == ("", "")


def test_progress_and_checkpoint_reports_keep_their_wire_format() -> None:
    assert ProgressReport(5, 1, 2, 3.5).to_wire() == {
        "step": 5,
        "epoch": 1,
        "world_size": 2,
        "samples_per_s": 3.5,
    }
    full = ProgressReport(5, 1, 2, 3.5, 0.25, ["a", "b"]).to_wire()
    assert full["loss"] == 0.25 and full["hosts"] == ["a", "b"]
    assert CheckpointReport("/ck/step-5", 5, 1, 2, 100, 0.5).to_wire() == {
        "checkpoint": {
            "path": "/ck/step-5",
            "step": 5,
            "epoch": 1,
            "world_size": 2,
            "bytes": 100,
            "write_s": 0.5,
        }
    }


def test_ledger_records_keep_their_keys(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path, "h/0", run_id="r1")
    ledger.generation(1, 0, 2, 0, "start")
    ledger.processed(1, 0, 0, [4, 5])
    ledger.committed(1, 0, 0, 2)
    ledger.close()
    records = [json.loads(line) for line in (tmp_path / "h_0.jsonl").read_text().splitlines()]
    assert [r["k"] for r in records] == [RecordKind.GENERATION, RecordKind.PROCESSED, RecordKind.COMMITTED]
    assert set(records[0]) == {"k", "g", "r", "ws", "s", "cause", "pid", "w", "t", "run"}
    assert records[1] == {"k": "p", "g": 1, "e": 0, "s": 0, "i": [4, 5], "t": records[1]["t"], "run": "r1"}
    assert set(records[2]) == {"k", "g", "e", "s", "ws", "t", "run"}


def _imports(module: str) -> set[str]:
    """Every module `elastrain/runtime/<module>.py` imports, at any depth (lazy imports included)."""
    tree = ast.parse((RUNTIME / f"{module}.py").read_text())
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return found


@pytest.mark.parametrize("module", ["state", "cycle", "connection", "group", "gradsync", "collective"])
def test_the_runtime_layers(module: str) -> None:
    imported = _imports(module)
    assert "elastrain.runtime.loop" not in imported  # the public face imports them, never the reverse
    if module != "state":
        assert "elastrain.runtime.state" not in imported or module == "cycle"
    assert "sys" not in imported or module == "cycle"  # no sys.exit anywhere (cycle prints to stderr)


def test_no_process_exits_in_the_runtime() -> None:
    for path in RUNTIME.glob("*.py"):
        text = path.read_text()
        assert "sys.exit(" not in text, path
        assert "os._exit(" not in text or path.name == "entry.py", path
