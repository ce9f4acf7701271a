"""The leave-nothing check finds the run's temp dirs and processes, and nothing older than the mark."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from elastrain.testing.leftovers import main, processes, temp_dirs
from elastrain.testing.processes import terminate


def test_temp_dirs_lists_the_runs_elastrain_dirs_only(tmp_path: Path) -> None:
    old = tmp_path / "elastrain-old"
    old.mkdir()
    os.utime(old, (1000.0, 1000.0))
    mark = time.time() - 1
    (tmp_path / "elastrain-fake-abc").mkdir()
    (tmp_path / "other-dir").mkdir()
    (tmp_path / "elastrain-file").write_text("not a directory")
    assert temp_dirs(mark, tmp_path) == [str(tmp_path / "elastrain-fake-abc")]


def test_processes_lists_a_tagged_child_started_after_the_mark_until_it_ends() -> None:
    mark = time.time() - 1
    env = dict(os.environ, ELASTRAIN_LEFTOVER_PROBE="1")
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], env=env)
    try:
        assert child.pid in processes(mark)
        assert child.pid in processes(mark, tag="ELASTRAIN_LEFTOVER_PROBE=1")
        assert child.pid not in processes(mark, tag="ELASTRAIN_LEFTOVER_PROBE=2")
        assert child.pid not in processes(time.time() + 60)  # started before that mark: not the run's
    finally:
        terminate(child)
    assert child.pid not in processes(mark)


def test_check_needs_a_state_file_or_a_start(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["check"])
    assert exited.value.code == 2
    assert "give the STATE file written by `mark`, or --since EPOCH" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["check", str(tmp_path / "missing.json")])
    assert "write it first with `mark" in capsys.readouterr().err
