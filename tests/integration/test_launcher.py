"""The launcher's other paths: user errors end the job once, restart mode, static hosts."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from elastrain.testing.jobs import REPO, hosts

pytestmark = pytest.mark.timeout(180)

RAISING = textwrap.dedent(
    """
    import torch
    import elastrain

    elastrain.init()
    model = torch.nn.Linear(2, 1)
    state = elastrain.State(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), step_no=0)

    @elastrain.run
    def train(state):
        while True:
            model(torch.ones(1, 2)).sum().backward()
            state.allreduce_gradients()
            state.commit()
            if state.step == 5 and state.rank == 1:
                raise ValueError("boom in user code")

    train(state)
    """
)

TORCHRUN_STYLE = textwrap.dedent(
    """
    import os, sys, time
    import torch, torch.distributed as dist

    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"rank={dist.get_rank()} world={dist.get_world_size()} sum={int(t.item())} "
          f"restart={os.environ['TORCHELASTIC_RESTART_COUNT']}", flush=True)
    marker = sys.argv[1]
    while not os.path.exists(marker) and dist.get_world_size() < 3:
        time.sleep(0.05)
    dist.barrier()
    dist.destroy_process_group()
    """
)


def test_worker_exception_ends_job_with_one_traceback(elastic_job, tmp_path: Path) -> None:
    script = tmp_path / "raising.py"
    script.write_text(RAISING)
    job = elastic_job(hosts(2), ["-np", "2"], ["python", str(script)])
    assert job.wait(timeout=120) != 0
    out = job.output()
    assert out.count("ValueError: boom in user code") == 1, out
    assert "job failed" in out


def test_unmodified_torchrun_script_restarts_on_scale_out(elastic_job, tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(TORCHRUN_STYLE)
    job = elastic_job(
        hosts(2),
        ["--min-np", "2", "--max-np", "3", "--join-grace", "1"],
        ["python", str(script), str(tmp_path / "never")],
    )
    job.watcher.wait("2 ranks ran", lambda: job.output().count("world=2 sum=2") == 2, timeout=60)
    job.set_hosts(hosts(3))
    assert job.wait(timeout=120) == 0, job.output()
    assert job.output().count("world=3 sum=3 restart=1") == 3, job.output()


def test_static_hosts_and_nproc_per_node(tmp_path: Path) -> None:
    script = tmp_path / "plain.py"
    script.write_text(TORCHRUN_STYLE)
    (tmp_path / "go").write_text("")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "elastrain",
            "run",
            "-H",
            "127.0.0.2",
            "--nproc-per-node",
            "2",
            "-np",
            "2",
            "python",
            str(script),
            str(tmp_path / "go"),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.count("world=2 sum=2 restart=0") == 2


def test_agent_started_by_hand_joins_as_a_remote_host(elastic_job, tmp_path: Path) -> None:
    """A host that is not local gets the `elastrain agent` command line; running it joins the job."""
    import os
    import re
    import shlex

    from elastrain.hostfile import Host

    script = tmp_path / "plain.py"
    script.write_text(TORCHRUN_STYLE)
    (tmp_path / "go").write_text("")
    job = elastic_job(
        [Host("127.0.0.2", 1), Host("node-b.invalid", 1)],
        ["-np", "2"],
        ["python", str(script), str(tmp_path / "go")],
    )
    job.watcher.wait("the agent command line", lambda: "elastrain agent --coordinator" in job.output(), 60)
    line = next(x for x in job.output().splitlines() if "elastrain agent --coordinator" in x)
    token = re.search(r"ELASTRAIN_JOB_TOKEN=(\S+)", line).group(1)
    argv = shlex.split(line.split("elastrain agent", 1)[1])
    agent = subprocess.Popen(
        [sys.executable, "-m", "elastrain", "agent", *argv],
        env={**os.environ, "ELASTRAIN_JOB_TOKEN": token},
        cwd=REPO,
    )
    try:
        assert job.wait(timeout=120) == 0, job.output()
        assert agent.wait(timeout=30) == 0
    finally:
        if agent.poll() is None:
            agent.kill()
            agent.wait()
    assert job.output().count("world=2 sum=2") == 1  # the local rank; the remote one printed to the agent
