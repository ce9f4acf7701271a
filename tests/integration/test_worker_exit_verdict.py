"""A worker that dies of an uncaught exception ends the job: Failed, exit 1, saying which worker and
its exit code, as the README's failure table says, even though its connection to the coordinator
closes before its agent reports the exit code (that report used to be ignored: the job went on with
fewer workers and could end in success)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from elastrain.testing.jobs import ElasticJob, hosts

SCRIPT = """
import os, time
import elastrain
elastrain.init()  # connected to the coordinator, as any worker of the job
if os.environ["ELASTRAIN_WORKER_ID"].startswith("127.0.0.3"):
    raise RuntimeError("boom outside elastrain's training loop")
time.sleep(120)
"""


def test_an_uncaught_exception_fails_the_job_with_exit_1(
    elastic_job: Callable[..., ElasticJob], tmp_path: Path
) -> None:
    script = tmp_path / "crash.py"
    script.write_text(SCRIPT)
    job = elastic_job(hosts(2), ["--min-np", "1", "--max-np", "2"], [sys.executable, str(script)])
    assert job.wait(timeout=120) == 1, job.output()
    output = job.output()
    assert "RuntimeError: boom outside elastrain's training loop" in output, output
    assert "job failed: worker 127.0.0.3#0 exited with code 1" in output, output
