"""Megatron-LM (megatron-core) for real, on CPU with gloo: the tiny GPT of examples/megatron_gpt.py
at tensor parallel 2 x data parallel 1 under torchrun, and an elastic job under
``elastrain run --mode restart`` whose data-parallel size follows the hostfile 1 -> 2 -> 1
(world 2 -> 4 -> 2), every sequence exactly once, the loss curve of the fixed-size run.

Skipped when megatron-core is not importable (pip install 'elastrain[megatron]').
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import warnings
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastrain.testing.jobs import REPO, ElasticJob, hosts
from elastrain.testing.timings import write_timing


def _megatron_missing() -> str | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            import megatron.core  # noqa: F401
    except Exception as exc:
        return f"megatron-core is not importable here ({exc!r}); pip install 'elastrain[megatron]'"
    return None


_MISSING = _megatron_missing()
if _MISSING:
    pytest.skip(_MISSING, allow_module_level=True)

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "megatron_gpt.py"
TORCHRUN = Path(sys.executable).parent / "torchrun"
STEPS, GLOBAL_BATCH = 36, 16
TIMINGS_FILE = REPO / "artifacts" / "megatron_timings.json"


@dataclass
class Run:
    """What one run printed (rank 0) and logged (--sample-log)."""

    output: str
    sample_log: Path

    def losses(self) -> dict[int, float]:
        """Step -> loss; a step printed twice (a repeated step) fails the test."""
        pairs = [(int(s), float(v)) for s, v in re.findall(r"step (\d+) loss ([\d.]+)", self.output)]
        repeated = [s for s, n in Counter(s for s, _ in pairs).items() if n > 1]
        assert not repeated, f"steps trained twice: {repeated}"
        return dict(pairs)

    def summary(self) -> str:
        lines = [line for line in self.output.splitlines() if "summary: steps per start" in line]
        assert len(lines) == 1, self.output[-4000:]
        return lines[0]


def record_timing(what: str, seconds: float) -> None:
    """Keep a measured figure in artifacts/megatron_timings.json (and print it with -s)."""
    write_timing(TIMINGS_FILE, what, seconds)


def assert_exactly_once(sample_log: Path, steps: int = STEPS) -> None:
    """Every sequence id of `steps` steps was trained on once: none lost, none repeated."""
    ids: list[int] = []
    for path in sample_log.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            ids.extend(json.loads(line)["ids"])
    total = steps * GLOBAL_BATCH
    dupes, missing = len(ids) - len(set(ids)), total - len(set(ids))
    assert (len(ids), dupes, missing, max(ids)) == (total, 0, 0, total - 1)


@pytest.fixture(scope="module")
def fixed_run(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The fixed-size reference: TP2 x DP1 under ``torchrun --standalone --nproc-per-node 2``."""
    workdir = tmp_path_factory.mktemp("megatron-fixed")
    argv = [
        str(TORCHRUN), "--standalone", "--nproc-per-node", "2", str(EXAMPLE),
        "--steps", str(STEPS), "--sample-log", str(workdir / "samples"),
    ]  # fmt: skip
    log = workdir / "out.log"
    t0 = time.monotonic()
    with open(log, "wb") as out:
        # torchrun puts its ranks in its own process group: a timeout kills that group
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        try:
            code = proc.wait(timeout=85)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
    text = log.read_text(errors="replace")
    assert code == 0, text[-4000:]
    record_timing("megatron torchrun TP2xDP1 36 steps: wall (s)", time.monotonic() - t0)
    return Run(text, workdir / "samples")


@pytest.mark.timeout(180, func_only=True)
def test_tp2_dp1_under_torchrun_trains(fixed_run: Run) -> None:
    out = fixed_run.output
    losses = fixed_run.losses()
    assert sorted(losses) == list(range(STEPS)), out[-3000:]
    assert losses[STEPS - 1] < losses[0] - 1.0, losses  # it learns (4.87 -> ~1.8)
    done = re.search(r"done: steps=(\d+) tp=2 dp=1 step_ms=([\d.]+) tp_maxdiff=(\S+) dp_maxdiff=(\S+)", out)
    assert done, out[-3000:]
    # the two tensor-parallel ranks hold the same replicated weights (the final layer norm)
    assert float(done.group(3)) == 0.0, done.group(0)
    record_timing("megatron TP2xDP1 step (ms)", float(done.group(2)))
    assert "summary: steps per start dp1:36; sequences 576" in fixed_run.summary()
    assert_exactly_once(fixed_run.sample_log)


def test_odd_world_size_is_refused_in_one_line() -> None:
    env = {**os.environ, "WORLD_SIZE": "3", "RANK": "0"}
    done = subprocess.run(
        [sys.executable, str(EXAMPLE)], env=env, capture_output=True, text=True, timeout=60, cwd=REPO
    )
    assert done.returncode == 1
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "world size 3 is odd" in done.stderr and "(2, 4, ...)" in done.stderr


def _steps_at(sample_log: Path, dp: int) -> int:
    """Steps rank 0 logged at data-parallel size `dp`."""
    return sum(p.read_text().count(f'"dp": {dp},') for p in sample_log.glob("samples-g*-r0-*.jsonl"))


def _first_steps(output: str, dp: int) -> list[float]:
    return [float(t) for t in re.findall(rf"first step dp={dp} restart=\d+ t=([\d.]+)", output)]


@pytest.mark.timeout(180, func_only=True)
def test_elastic_dp_grows_and_shrinks_exactly_once(elastic_job, tmp_path: Path, fixed_run: Run) -> None:
    samples = tmp_path / "samples"
    job: ElasticJob = elastic_job(
        hosts(2),
        ["--mode", "restart", "--min-np", "2", "--max-np", "4", "--join-grace", "1"],
        [
            "python", str(EXAMPLE), "--steps", str(STEPS),
            "--checkpoint-dir", str(tmp_path / "ckpt"), "--sample-log", str(samples),
            "--step-sleep", "0.1",  # ~0.15 s a step: both resizes land mid-run
        ],
    )  # fmt: skip
    wait = job.watcher.wait
    wait("6 steps at DP 1", lambda: _steps_at(samples, 1) >= 6, timeout=45)
    grow_at = time.time()
    job.set_hosts(hosts(4))
    wait("the first step at DP 2", lambda: bool(_first_steps(job.output(), 2)), timeout=45)
    wait("4 steps at DP 2", lambda: _steps_at(samples, 2) >= 4, timeout=20)
    shrink_at = time.time()
    job.set_hosts(hosts(2))
    wait("the first step at DP 1 again", lambda: len(_first_steps(job.output(), 1)) >= 2, timeout=45)
    assert job.wait(timeout=45) == 0, job.output()[-4000:]
    out = job.output()

    resumes = re.findall(r"resumed step=\d+ from dp=(\d) to dp=(\d)", out)
    assert resumes == [("1", "2"), ("2", "1")], out[-4000:]
    run = Run(out, samples)
    assert re.search(r"steps per start dp1:\d+ dp2:\d+ dp1:\d+; sequences 576", run.summary()), run.summary()
    assert_exactly_once(samples)
    losses, reference = run.losses(), fixed_run.losses()
    assert sorted(losses) == list(range(STEPS))
    worst = max(abs(losses[s] - reference[s]) for s in range(STEPS))
    print(f"\nlargest loss difference from the fixed-size run: {worst:.1e}")
    assert worst < 1e-4, f"the loss curve differs from the fixed-size run by {worst}"

    grow_pause = _first_steps(out, 2)[0] - grow_at
    shrink_pause = _first_steps(out, 1)[-1] - shrink_at
    record_timing(
        "megatron restart resize DP1->2 (world 2->4): hostfile change -> first step (s)", grow_pause
    )
    record_timing(
        "megatron restart resize DP2->1 (world 4->2): hostfile change -> first step (s)", shrink_pause
    )
    step_ms = [
        float(m) for m in re.findall(r"step \d+ loss [\d.]+ grad_norm [\d.]+ tp=2 dp=2 ms=([\d.]+)", out)
    ]
    record_timing("megatron TP2xDP2 step, 4 ranks on the 2 cores (ms)", sum(step_ms) / len(step_ms))
    assert grow_pause < 60 and shrink_pause < 60
