"""Elastic DeepSpeed ZeRO training in restart mode (``elastrain run --mode restart ... train.py``).

In restart mode every change of the hostfile stops the script (SIGTERM, then SIGKILL after the
agent's grace period, 10 s) and starts it again with the new RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT.
A ZeRO-1/2 checkpoint holds one optimizer partition per data-parallel rank, and DeepSpeed refuses to
load it at another data-parallel size. This module closes the gap with three pieces:

* `GracefulStop`: SIGTERM only raises a flag. The ranks agree on it in the per-step all-reduce of
  `reduce_step`, so all of them stop after the same step, checkpoint together and exit: nothing done
  is lost, nothing is done twice.
* `ElasticCheckpointer`: saves with ``engine.save_checkpoint`` under a tag per step and size, and
  commits by atomically replacing ``elastrain_latest.json`` once every rank has written its files
  (DeepSpeed's own ``latest`` file is written by rank 0 without waiting for the other ranks). A
  checkpoint saved at another data-parallel size is converted once, by rank 0, with DeepSpeed's
  universal-checkpoint converter (``deepspeed.checkpoint.ds_to_universal``) and then loaded by every
  rank with ``"checkpoint": {"load_universal": true}``: ZeRO repartitions the fp32 weights and the
  Adam moments for the new size.
* `reduce_step`: one small all-reduce per step of (loss sum, samples, stop flag).

Data stays exactly-once when the script keeps its sample cursor in the checkpoint (the example uses
`elastrain.runtime.data.ElasticSampler`): after a restart the rest of the epoch is split over the
new world. The checkpoint directory must be shared by every host.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from elastrain.errors import CheckpointError

POINTER = "elastrain_latest.json"
UNIVERSAL_SUFFIX = "_universal"
CLIENT_KEY = "elastrain"
STOP_EXIT_CODE = 128 + signal.SIGTERM  # what a script that stopped for a resize exits with


class GracefulStop:
    """Turns SIGTERM (and optionally SIGINT: a second one interrupts) into a flag checked between steps."""

    def __init__(self, signals: tuple[signal.Signals, ...] = (signal.SIGTERM,)) -> None:
        # a stop is wanted: by this process's signal or, after reduce_step, by any rank's
        self.requested = False
        self.received = False  # this process got one of `signals`
        self.received_at: float | None = None
        for sig in signals:
            signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, _frame: object) -> None:
        if self.received and signum == signal.SIGINT:
            raise KeyboardInterrupt  # a second Ctrl-C: do not wait for the checkpoint
        self.requested = True
        self.received = True
        if self.received_at is None:
            self.received_at = time.time()

    def wait_for_signal(self, timeout_s: float) -> bool:
        """Wait until this process got its own signal (its peers may have got theirs first)."""
        deadline = time.monotonic() + timeout_s
        while not self.received and time.monotonic() < deadline:
            time.sleep(0.05)
        return self.received


@dataclass(frozen=True)
class StepTotals:
    """One step summed over all ranks."""

    loss_sum: float
    samples: int
    stop: bool


def reduce_step(loss_sum: float, samples: int, stop: GracefulStop) -> StepTotals:
    """All-reduce this rank's (loss sum, samples, stop wanted); every rank gets the same answer."""
    import torch
    import torch.distributed as dist

    values = torch.tensor([loss_sum, float(samples), 1.0 if stop.requested else 0.0], dtype=torch.float64)
    dist.all_reduce(values)
    agreed = bool(values[2].item() > 0)
    if agreed:
        stop.requested = True
    return StepTotals(float(values[0].item()), round(values[1].item()), agreed)


@dataclass(frozen=True)
class ResumePlan:
    """What to load: `tag` in the checkpoint directory, universal or not, and what that cost."""

    tag: str
    saved_tag: str
    saved_world: int
    world: int
    universal: bool
    convert_s: float


def _rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_initialized() else 0


def _broadcast(value: Any) -> Any:
    """Rank 0's `value` on every rank (a collective)."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def universal_checkpoint_info() -> dict[str, Any]:
    """The client-state entry DeepSpeed's universal converter requires (Megatron-DeepSpeed writes it)."""
    try:
        from deepspeed.checkpoint.constants import (
            UNIVERSAL_CHECKPOINT_INFO,
            UNIVERSAL_CHECKPOINT_VERSION_KEY,
            UNIVERSAL_CHECKPOINT_VERSION_VALUE,
        )
    except ImportError:  # an older DeepSpeed: the names it has used since 0.10
        return {"universal_checkpoint_info": {"universal_checkpoint_version": 0.2}}
    return {UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}}


def convert_to_universal(checkpoint_dir: Path, tag: str, out_tag: str) -> None:
    """Run DeepSpeed's ``ds_to_universal`` in this process; the result appears atomically as `out_tag`."""
    from deepspeed.checkpoint import ds_to_universal

    tmp = checkpoint_dir / f".{out_tag}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    args = argparse.Namespace(
        input_folder=str(checkpoint_dir / tag),
        output_folder=str(tmp),
        num_extract_workers=1,  # 1: no process pool (this process holds a process group)
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    log = io.StringIO()
    try:
        with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
            ds_to_universal.main(args)
    except Exception as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(
            f"converting DeepSpeed checkpoint {checkpoint_dir / tag} to a universal checkpoint failed: "
            f"{exc!r}\n{log.getvalue()[-2000:]}"
        ) from exc
    os.replace(tmp, checkpoint_dir / out_tag)
    _atomic_write(checkpoint_dir / "latest_universal", out_tag)  # the converter pointed it at the temp name


class ElasticCheckpointer:
    """Save and load a DeepSpeed engine so that the next start may have another data-parallel size.

    Call order in the script: ``deepspeed.init_distributed(...)``; ``plan = ckpt.plan(world)``;
    ``engine = deepspeed.initialize(config=ckpt.config_for(config, plan), ...)``;
    ``state = ckpt.load(engine, plan)``; then ``ckpt.save(engine, step, state)`` on every rank.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 2) -> None:
        if keep < 1:
            raise CheckpointError(f"keep must be >= 1, got {keep}")
        self.dir = Path(directory)
        self.keep = keep
        self.last_tag: str | None = None  # the checkpoint this process loaded or saved last

    def pointer(self) -> dict[str, Any] | None:
        """The committed checkpoint (``elastrain_latest.json``), or None before the first."""
        path = self.dir / POINTER
        if not path.is_file():
            return None
        try:
            info: dict[str, Any] = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise CheckpointError(f"{path} is unreadable ({exc}); remove it to start over") from exc
        return info

    def _partitioned(self, tag: str) -> bool:
        return any((self.dir / tag).glob("*optim_states.pt"))

    def plan(self, world_size: int) -> ResumePlan | None:
        """Decide what to load at `world_size` (a collective: every rank calls it before initialize).

        Rank 0 reads the pointer and, when the committed checkpoint has ZeRO partitions for another
        size, converts it to a universal checkpoint (once; kept beside the original).
        """
        plan: ResumePlan | CheckpointError | None = None
        if _rank() == 0:
            try:
                plan = self._plan_on_rank0(world_size)
            except CheckpointError as exc:
                plan = exc
        plan = _broadcast(plan)
        if isinstance(plan, CheckpointError):
            raise plan
        return plan

    def _plan_on_rank0(self, world_size: int) -> ResumePlan | None:
        info = self.pointer()
        if info is None:
            return None
        tag, saved_world = str(info["tag"]), int(info["world_size"])
        if not (self.dir / tag).is_dir():
            raise CheckpointError(f"{self.dir / POINTER} names {tag}, which is missing")
        universal = saved_world != world_size and self._partitioned(tag)
        started = time.monotonic()
        load_tag = tag
        if universal:
            load_tag = tag + UNIVERSAL_SUFFIX
            if not (self.dir / load_tag).is_dir():
                convert_to_universal(self.dir, tag, load_tag)
        return ResumePlan(load_tag, tag, saved_world, world_size, universal, time.monotonic() - started)

    @staticmethod
    def config_for(config: dict[str, Any], plan: ResumePlan | None) -> dict[str, Any]:
        """`config` with ``checkpoint.load_universal`` set as `plan` needs it (a copy)."""
        out = copy.deepcopy(config)
        if plan is not None:
            out.setdefault("checkpoint", {})["load_universal"] = plan.universal
        return out

    def load(self, engine: Any, plan: ResumePlan) -> dict[str, Any]:
        """Load `plan` into `engine` (module, ZeRO optimizer partitions, scheduler); return the
        script's state saved with it."""
        path, client = engine.load_checkpoint(
            str(self.dir), tag=plan.tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
        if path is None:
            raise CheckpointError(f"DeepSpeed could not load checkpoint {self.dir / plan.tag}")
        self.last_tag = plan.saved_tag
        state: dict[str, Any] = (client or {}).get(CLIENT_KEY, {})
        return state

    def save(self, engine: Any, step: int, state: dict[str, Any]) -> str:
        """Save on every rank (a collective); returns the tag once the checkpoint is committed."""
        world = int(getattr(engine, "dp_world_size", 0) or engine.world_size)
        tag = f"step{step:08d}-dp{world}"
        client = {CLIENT_KEY: state, **universal_checkpoint_info()}
        self.dir.mkdir(parents=True, exist_ok=True)
        # save_checkpoint ends with a barrier: when it returns every rank has written its partition
        engine.save_checkpoint(str(self.dir), tag=tag, client_state=client, save_latest=False)
        if _rank() == 0:
            previous = self.pointer() or {}
            history = [t for t in previous.get("history", []) if t != tag] + [tag]
            pointer = {"tag": tag, "world_size": world, "step": step, "saved_at": time.time()}
            _atomic_write(self.dir / POINTER, json.dumps({**pointer, "history": history[-self.keep :]}))
            for old in history[: -self.keep]:
                shutil.rmtree(self.dir / old, ignore_errors=True)
                shutil.rmtree(self.dir / (old + UNIVERSAL_SUFFIX), ignore_errors=True)
        self.last_tag = tag
        return tag
