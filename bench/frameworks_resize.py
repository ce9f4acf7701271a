"""DeepSpeed ZeRO resized in place vs by restart: the training pause of each resize, in one invocation.

    .venv/bin/python bench/frameworks_resize.py [--config examples/ds_zero2.json] [--steps 5]

Runs the shipped example (`examples/deepspeed_train.py`, real processes on loopback hosts, gloo) twice:
natively (`elastrain run`, in place: `elastrain.deepspeed.ElasticZero`) and in restart mode
(`elastrain run --mode restart --checkpoint-dir`, a universal checkpoint at each new size). In each run
the hostfile goes 2 -> 4 -> 2 with `--steps` steps at every size, then (in place only) one rank is killed
with `kill -9`. The pause of a transition is the gap in training: the first step any rank completes at
the new size minus the last step completed at the old size (both from per-step timestamps: elastrain's
ledger in place, the example's `--sample-log` in restart mode). Nothing asserts on the figures.

Prints one line per transition, ``deepspeed zero2 in-place pause P_in s vs restart P_re s (ratio)``, and
the kill -9 recovery ``deepspeed zero2 in-place kill -9: pause P s, steps lost L, processes restarted 0``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from elastrain.report import build_report  # noqa: E402
from elastrain.testing.jobs import ElasticJob, hosts  # noqa: E402
from elastrain.testing.waits import wait_until  # noqa: E402

EXAMPLE = REPO / "examples" / "deepspeed_train.py"
SAMPLES = 4096
SIZES = (2, 4, 2)


def example(config: Path, extra: list[str]) -> list[str]:
    """The example, slowed to 0.25 s per step so that every size gets its steps before the next change."""
    return [
        "python", str(EXAMPLE), "--deepspeed_config", str(config), "--epochs", "50",
        "--samples", str(SAMPLES), "--step-sleep", "0.25", *extra,
    ]  # fmt: skip


def ledger_steps(ledger: Path) -> list[tuple[float, int, int]]:
    """(time, generation, world) of every step any rank committed (elastrain's ledger)."""
    out = []
    for path in ledger.glob("*#*.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("k") == "c":
                out.append((float(record["t"]), int(record["g"]), int(record["ws"])))
    return sorted(out)


def sample_log_steps(samples: Path) -> list[tuple[float, int, int]]:
    """(time, start number, world) of every step any rank did (the example's --sample-log, restart mode)."""
    out = []
    for path in samples.glob("samples-g*-r*-p*.jsonl"):
        restart = int(path.name.split("-")[1][1:])
        for line in path.read_text().splitlines():
            record = json.loads(line)
            out.append((float(record["t"]), restart, int(record["world"])))
    return sorted(out)


def pauses(steps: list[tuple[float, int, int]]) -> list[tuple[int, int, float]]:
    """(old world, new world, gap in seconds) at every change of generation."""
    last: dict[int, float] = {}
    first: dict[int, tuple[float, int]] = {}
    for t, generation, world in steps:
        last[generation] = max(last.get(generation, t), t)
        first.setdefault(generation, (t, world))
    order = sorted(first)
    return [(first[a][1], first[b][1], first[b][0] - last[a]) for a, b in itertools.pairwise(order)]


def steps_at(steps: list[tuple[float, int, int]], world: int, since: float) -> int:
    """Steps done at `world` since `since` (any rank)."""
    return sum(1 for t, _g, w in steps if w == world and t >= since)


def run(mode: str, config: Path, workdir: Path, per_size: int) -> tuple[list[tuple[int, int, float]], str]:
    """One job through `SIZES` (in place, then a kill -9 too); its pauses and the kill's figures."""
    workdir.mkdir(parents=True)
    samples = workdir / "samples"
    flags = ["--min-np", "2", "--max-np", "4"]
    extra: list[str] = []
    if mode == "restart":
        flags = ["--mode", "restart", *flags]
        extra = ["--checkpoint-dir", str(workdir / "ckpt"), "--sample-log", str(samples)]

    def read() -> list[tuple[float, int, int]]:
        return ledger_steps(workdir / "ledger") if mode == "in-place" else sample_log_steps(samples)

    job = ElasticJob(workdir, hosts(SIZES[0]), flags, example(config, extra))
    try:
        since = 0.0
        for i, size in enumerate(SIZES):
            if i:
                since = time.time()
                job.set_hosts(hosts(size))
            what = f"{per_size} steps at world {size} ({mode})"
            wait_until(lambda s=size, t=since: steps_at(read(), s, t) >= per_size, 600, what)
        killed = ""
        if mode == "in-place":
            job.set_hosts(hosts(3))
            gen = job.wait_world(3, per_size)
            os.kill(int(gen["members"][-1]["pid"]), signal.SIGKILL)
            job.wait_world(2, per_size)
            failure = build_report(job.ledger, SAMPLES)["generations"][-1]
            gap = pauses(read())[-1][2]
            killed = f"pause {gap:.2f} s, steps lost {failure['steps_lost']}, processes restarted 0"
        return pauses(read())[: len(SIZES) - 1], killed
    finally:
        job.cleanup()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--config", type=Path, default=REPO / "examples" / "ds_zero2.json")
    parser.add_argument("--steps", type=int, default=5, help="steps at each size before the next change")
    args = parser.parse_args()
    stage = "zero" + str(json.loads(args.config.read_text())["zero_optimization"]["stage"])
    with tempfile.TemporaryDirectory(prefix="elastrain-fw-resize-") as tmp:
        inplace, killed = run("in-place", args.config, Path(tmp) / "in-place", args.steps)
        restart, _ = run("restart", args.config, Path(tmp) / "restart", args.steps)
    for (old, new, p_in), (_o, _n, p_re) in zip(inplace, restart):
        print(f"deepspeed {stage} in-place pause {p_in:.2f} s vs restart {p_re:.2f} s "
              f"({p_re / max(p_in, 1e-6):.0f}x), {old} -> {new}")  # fmt: skip
    print(f"deepspeed {stage} in-place kill -9 (3 -> 2): {killed}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
