"""tests/sharding.py: the shares `make test` runs at once cover every selected test exactly once, whole
modules each, balanced by the recorded durations; `serial` tests are in none; bad --shard is one line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.sharding import assign, parse_shard

SUITE = {
    "test_long.py": "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    pass\n",
    "test_short.py": "def test_c():\n    pass\n",
    "test_other.py": "def test_d():\n    pass\n\ndef test_e():\n    pass\n",
    "test_load.py": "import pytest\n\n@pytest.mark.serial\ndef test_latency():\n    pass\n",
}


def test_assign_puts_the_longest_module_first_onto_the_lightest_share() -> None:
    shares = assign({"a": 100.0, "b": 60.0, "c": 50.0, "d": 10.0}, 2)
    assert shares == [["a", "d"], ["b", "c"]]
    assert sorted(m for share in assign({"x": 1.0, "y": 1.0, "z": 1.0}, 3) for m in share) == ["x", "y", "z"]


@pytest.mark.parametrize("text", ["2", "0/2", "3/2", "a/b", "1/2/3"])
def test_a_bad_shard_is_a_usage_error_that_shows_the_form(text: str) -> None:
    with pytest.raises(pytest.UsageError, match="--shard 1/2"):
        parse_shard(text)


def _run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    serial: alone\n")
    repo = Path(__file__).resolve().parents[2]
    command = [sys.executable, "-m", "pytest", "-p", "tests.sharding", "-p", "no:cacheprovider", *args]
    env = {"PYTHONPATH": str(repo), "PATH": "/usr/bin:/bin"}
    return subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env)


def _passed(output: str) -> set[str]:
    return {line.split()[0] for line in output.splitlines() if " PASSED" in line}


def test_the_shares_cover_every_test_once_whole_modules_and_leave_serial_ones_out(tmp_path: Path) -> None:
    recorded = tmp_path / "d.json"
    shares = []
    for k in (1, 2):
        record = [f"--record-durations={recorded}"] if k == 1 else []
        done = _run(tmp_path, "-v", f"--shard={k}/2", *record, ".")
        assert done.returncode == 0, done.stdout + done.stderr
        shares.append(_passed(done.stdout))
    expected = {"test_long.py": "ab", "test_short.py": "c", "test_other.py": "de"}
    assert sorted(shares[0] | shares[1]) == sorted(f"{m}::test_{t}" for m, ts in expected.items() for t in ts)
    assert not shares[0] & shares[1]
    modules = [{nodeid.split("::")[0] for nodeid in share} for share in shares]
    assert not modules[0] & modules[1], "a module was split between shares"
    assert sorted(json.loads(recorded.read_text())) == sorted(shares[0]), "the durations of share 1"
    serial = _run(tmp_path, "-v", "-m", "serial", ".")
    assert _passed(serial.stdout) == {"test_load.py::test_latency"}


def test_a_bad_shard_on_the_command_line_is_one_line(tmp_path: Path) -> None:
    done = _run(tmp_path, "--shard=3/2")
    assert done.returncode == 4
    assert "--shard '3/2': K must be between 1 and N" in done.stderr
    assert "Traceback" not in done.stderr
