"""DeepSpeed for real, on CPU with gloo: ZeRO-1 and ZeRO-2 under DeepSpeed's own launcher, and an
elastic ZeRO-2 job that grows 2 -> 4 and shrinks back under ``elastrain run --mode restart``.

The elastic job resumes from its checkpoint at each new data-parallel size through DeepSpeed's
universal checkpoint (`elastrain.frameworks.deepspeed_elastic`); every sample must be used exactly
once per epoch and the loss curve must match the fixed-size run. Skipped when DeepSpeed is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

from elastrain.testing.jobs import REPO, ElasticJob, hosts
from elastrain.testing.ports import free_port
from elastrain.testing.timings import write_timing


def _deepspeed_missing() -> str | None:
    if importlib.util.find_spec("deepspeed") is None:
        return "DeepSpeed is not installed (pip install 'elastrain[deepspeed]')"
    try:
        import deepspeed  # noqa: F401
    except Exception as exc:  # a DeepSpeed that does not import against this torch is as good as none
        return f"import deepspeed fails here: {exc!r}"
    if not (Path(sys.executable).parent / "deepspeed").is_file():
        return f"DeepSpeed's launcher is not in {Path(sys.executable).parent}"
    return None


_MISSING = _deepspeed_missing()
if _MISSING:
    pytest.skip(_MISSING, allow_module_level=True)

pytestmark = pytest.mark.slow

EXAMPLE = REPO / "examples" / "deepspeed_train.py"
SAMPLES = 4096
EPOCHS = 2
LAUNCHER = Path(sys.executable).parent / "deepspeed"
TIMINGS_FILE = REPO / "artifacts" / "deepspeed_timings.json"


@dataclass
class Run:
    """What one training run printed and logged."""

    output: str
    sample_log: Path

    def epoch_losses(self) -> list[float]:
        return [float(v) for v in re.findall(r"epoch \d+ loss ([\d.]+)", self.output)]

    def summary(self) -> str:
        lines = [line for line in self.output.splitlines() if "summary: samples per rank" in line]
        assert len(lines) == 1, self.output[-4000:]
        return lines[0]


def record_timing(what: str, seconds: float) -> None:
    """Keep a measured figure in artifacts/deepspeed_timings.json (and print it with -s)."""
    write_timing(TIMINGS_FILE, what, seconds)


def assert_exactly_once(sample_log: Path, epochs: int = EPOCHS) -> None:
    """Every epoch used every sample once: nothing lost, nothing repeated, also across restarts."""
    ids: dict[int, list[int]] = defaultdict(list)
    for path in sample_log.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            ids[record["epoch"]].extend(record["ids"])
    assert sorted(ids) == list(range(epochs))
    for epoch, seen in ids.items():
        dupes = len(seen) - len(set(seen))
        missing = SAMPLES - len(set(seen))
        assert (len(seen), dupes, missing) == (SAMPLES, 0, 0), f"epoch {epoch}"


def run_under_deepspeed(workdir: Path, config: str) -> Run:
    """`deepspeed --hostfile H examples/deepspeed_train.py --deepspeed_config C` with 2 local slots."""
    workdir.mkdir(parents=True, exist_ok=True)
    hostfile = workdir / "hostfile"
    hostfile.write_text("localhost slots=2\n")
    argv = [
        str(LAUNCHER),
        "--hostfile", str(hostfile),
        "--no_ssh_check",  # a hostfile makes the launcher ssh to its first host; no sshd here
        "--master_addr", "127.0.0.1",  # else it asks the first host over ssh (`hostname -I`)
        "--master_port", str(free_port()),
        str(EXAMPLE),
        "--deepspeed_config", str(REPO / "examples" / config),
        "--epochs", str(EPOCHS),
        "--sample-log", str(workdir / "samples"),
    ]  # fmt: skip
    log = workdir / "out.log"
    with open(log, "wb") as out:
        # the launcher puts the ranks in its own process group; a timeout kills the whole group
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
        try:
            code = proc.wait(timeout=85)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            code = -9
    text = log.read_text(errors="replace")
    assert code == 0, text[-4000:]
    return Run(text, workdir / "samples")


@pytest.fixture(scope="module")
def fixed_zero2(tmp_path_factory: pytest.TempPathFactory) -> Run:
    """The fixed-size reference: ZeRO-2 at 2 ranks under DeepSpeed's launcher."""
    # on CPU, init_distributed JIT-compiles DeepSpeed's shared-memory op once per machine (~45 s, needs
    # a C++ compiler; cached under ~/.cache/torch_extensions): do it here, not inside a timed test
    subprocess.run(
        [sys.executable, "-c", "from deepspeed.comm.torch import build_shm_op; build_shm_op()"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return run_under_deepspeed(tmp_path_factory.mktemp("ds-zero2"), "ds_zero2.json")


def check_fixed_run(run: Run) -> None:
    assert "samples_per_rank=[4096, 4096]" in run.output, run.output[-3000:]
    assert f"total {EPOCHS * SAMPLES}" in run.summary()
    losses = run.epoch_losses()
    assert len(losses) == EPOCHS and losses[-1] < losses[0], run.output[-3000:]
    assert_exactly_once(run.sample_log)


@pytest.mark.timeout(90, func_only=True)
def test_zero2_under_deepspeed_launcher(fixed_zero2: Run) -> None:
    check_fixed_run(fixed_zero2)


@pytest.mark.timeout(90, func_only=True)
def test_zero1_under_deepspeed_launcher(tmp_path: Path, fixed_zero2: Run) -> None:
    run = run_under_deepspeed(tmp_path, "ds_zero1.json")
    check_fixed_run(run)
    # ZeRO-1 and ZeRO-2 partition differently but compute the same fp32 Adam steps
    assert run.epoch_losses() == pytest.approx(fixed_zero2.epoch_losses(), rel=1e-4)


def _steps_at(sample_log: Path, world: int) -> int:
    """Steps rank 0 logged at data-parallel size `world`."""
    count = 0
    for path in sample_log.glob("samples-g*-r0-*.jsonl"):
        count += sum(1 for line in path.read_text().splitlines() if f'"world": {world},' in line)
    return count


def _first_step_times(output: str, world: int) -> list[float]:
    return [float(t) for t in re.findall(rf"first step world={world} restart=\d+ t=([\d.]+)", output)]


@pytest.mark.timeout(90, func_only=True)
def test_elastic_zero2_grows_and_shrinks_exactly_once(elastic_job, tmp_path: Path, fixed_zero2: Run) -> None:
    samples = tmp_path / "samples"
    job: ElasticJob = elastic_job(
        hosts(2),
        ["--mode", "restart", "--min-np", "2", "--max-np", "4", "--join-grace", "1"],
        [
            "python", str(EXAMPLE),
            "--deepspeed_config", str(REPO / "examples" / "ds_zero2.json"),
            "--epochs", str(EPOCHS),
            "--checkpoint-dir", str(tmp_path / "ckpt"),
            "--sample-log", str(samples),
            "--step-sleep", "0.05",  # ~70 ms a step: both resizes land mid-run
        ],
    )  # fmt: skip
    wait = job.watcher.wait
    wait("8 steps at 2 ranks", lambda: _steps_at(samples, 2) >= 8, timeout=60)
    grow_at = time.time()
    job.set_hosts(hosts(4))
    wait("the first step at 4 ranks", lambda: bool(_first_step_times(job.output(), 4)), timeout=60)
    wait("5 steps at 4 ranks", lambda: _steps_at(samples, 4) >= 5, timeout=30)
    shrink_at = time.time()
    job.set_hosts(hosts(2))
    wait("the first step at 2 ranks again", lambda: len(_first_step_times(job.output(), 2)) >= 2, timeout=60)
    assert job.wait(timeout=60) == 0, job.output()[-4000:]
    out = job.output()

    # the job really ran at 2, then 4, then 2 ranks, resuming through universal checkpoints
    resumes = re.findall(r"resumed step=\d+ .* from dp=(\d) to dp=(\d) universal=(\w+)", out)
    assert resumes == [("2", "4", "True"), ("4", "2", "True")], out[-4000:]
    run = Run(out, samples)
    assert re.search(r"w2:\[\d+, \d+\] w4:\[\d+, \d+, \d+, \d+\] w2:\[\d+, \d+\]; total 8192", run.summary())
    assert_exactly_once(samples)
    assert run.epoch_losses() == pytest.approx(fixed_zero2.epoch_losses(), rel=1e-4, abs=1e-5)

    grow_pause = _first_step_times(out, 4)[0] - grow_at
    shrink_pause = _first_step_times(out, 2)[-1] - shrink_at
    record_timing("deepspeed restart resize 2->4: hostfile change -> first step at 4 (s)", grow_pause)
    record_timing("deepspeed restart resize 4->2: hostfile change -> first step at 2 (s)", shrink_pause)
    assert grow_pause < 60 and shrink_pause < 60
