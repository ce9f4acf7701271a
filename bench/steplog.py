"""Reading the step logs (see workload.py) and turning them into the benchmark's figures.

A "configuration" is what a step ran in: (pid, generation). elastrain's survivors keep their pid and
move to a new generation after a resize; torchrun restarts every worker, so its pids change. The
steps of an event's old configurations are those seen before the event; the first step of a new
configuration at the expected world size ends the event.
"""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Step:
    """One completed step on one process."""

    t: float
    step: int
    world: int
    rank: int
    gen: int
    pid: int
    node: str

    @property
    def config(self) -> tuple[int, int]:
        """(pid, generation): what the step ran in."""
        return (self.pid, self.gen)


@dataclass(frozen=True)
class Mark:
    """One start-up milestone of one process."""

    name: str
    t: float
    pid: int
    node: str
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


class LogReader:
    """Reads a step-log directory incrementally (only new, complete lines on each `poll`)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.steps: list[Step] = []
        self.marks: list[Mark] = []
        self._offsets: dict[Path, int] = {}

    def poll(self) -> LogReader:
        """Read what was appended since the last call; returns self."""
        if not self.directory.exists():
            return self
        for path in sorted(self.directory.glob("*.jsonl")):
            offset = self._offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            end = data.rfind(b"\n") + 1
            if end == 0:
                continue
            self._offsets[path] = offset + end
            for line in data[:end].splitlines():
                self._add(line)
        return self

    def _add(self, line: bytes) -> None:
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            return
        if r.get("k") == "s":
            self.steps.append(Step(r["t"], r["s"], r["ws"], r["r"], r["g"], r["pid"], r["node"]))
        elif r.get("k") == "m":
            extra = {k: v for k, v in r.items() if k not in ("k", "name", "t", "pid", "node")}
            self.marks.append(Mark(r["name"], r["t"], r["pid"], r["node"], extra))

    # ----- queries used while driving a job ----------------------------------------------------
    def max_step(self) -> int:
        """Highest step index completed so far (-1 before the first)."""
        return max((s.step for s in self.steps), default=-1)

    def steps_since(self, t: float, world: int | None = None) -> int:
        """Distinct step indices completed after `t` (at world size `world` when given)."""
        return len({s.step for s in self.steps if s.t > t and (world is None or s.world == world)})

    def current_world(self) -> int:
        """World size of the most recent step (0 before the first)."""
        return max(self.steps, key=lambda s: s.t).world if self.steps else 0

    def latest_pid_on(self, node: str) -> int | None:
        """The pid of the most recent step logged from `node`."""
        mine = [s for s in self.steps if s.node == node]
        return max(mine, key=lambda s: s.t).pid if mine else None

    def step_time(self) -> float:
        """Median interval between the last 20 steps of rank 0 (for sizing margins)."""
        times = sorted(s.t for s in self.steps if s.rank == 0)[-21:]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        return statistics.median(gaps) if gaps else 0.1

    def marks_of(self, pid: int) -> dict[str, float]:
        """Start-up marks of `pid` by name (the first of each name)."""
        out: dict[str, float] = {}
        for m in sorted(self.marks, key=lambda m: m.t):
            if m.pid == pid:
                out.setdefault(m.name, m.t)
        return out


def steady_step_time(steps: Iterable[Step], skip: int, window: int) -> dict[str, Any]:
    """Rank 0's step intervals over steps [skip, skip + window): median, mean, min, max (seconds)."""
    times = {s.step: s.t for s in steps if s.rank == 0}
    span = [times[i] for i in range(skip, skip + window + 1) if i in times]
    gaps = [b - a for a, b in itertools.pairwise(span)]
    if len(gaps) < max(5, window // 2):
        return {"ok": False, "steps_seen": len(times)}
    return {
        "ok": True,
        "step_s": statistics.median(gaps),
        "mean_step_s": (span[-1] - span[0]) / (len(span) - 1),
        "min_step_s": min(gaps),
        "max_step_s": max(gaps),
        "window": [skip, skip + window],
        "intervals": len(gaps),
    }


def event_figures(steps: list[Step], t_event: float, new_world: int, after: int) -> dict[str, Any]:
    """Figures of one resize or failure at `t_event`, from every process's step log.

    * ``to_new_size_s``: event -> first step of a new configuration at `new_world`;
    * ``pause_s``: the longest gap between completed steps (any process) from the last step before
      the event until `after` steps at the new size;
    * ``steps_lost``: steps completed by what ran at the event that were completed again after it;
    * ``progress_regained_s``: event -> first step beyond the highest step completed before it.
    """
    before = [s for s in steps if s.t <= t_event]
    old_configs = {s.config for s in before}
    last_before = max((s.t for s in before), default=t_event)
    recent = {s.config for s in before if s.t >= last_before - 1.0}  # what ran at the event
    old = [s for s in steps if s.config in recent]
    new = sorted((s for s in steps if s.t > t_event and s.config not in old_configs), key=lambda s: s.t)
    at_size = [s for s in new if s.world == new_world]
    if not old or not at_size:
        return {"ok": False, "old_steps": len(old), "new_steps": len(new), "new_at_size": len(at_size)}
    first = at_size[0]
    last_old_before = last_before
    old_max = max(s.step for s in old)
    first_new_step = min(s.step for s in new)
    indices = sorted({s.step for s in at_size})
    end_step = indices[min(after, len(indices)) - 1]
    end_t = min(s.t for s in at_size if s.step == end_step)
    times = sorted({round(s.t, 6) for s in steps if last_old_before <= s.t <= end_t})
    gaps = [(b - a, a) for a, b in itertools.pairwise(times)]
    pause, pause_at = max(gaps) if gaps else (0.0, t_event)
    beyond = [s.t for s in new if s.step > old_max]
    return {
        "ok": True,
        "to_new_size_s": first.t - t_event,
        "pause_s": pause,
        "pause_starts_after_event_s": pause_at - t_event,
        "steps_lost": max(0, old_max + 1 - first_new_step),
        "progress_regained_s": (min(beyond) - t_event) if beyond else None,
        "last_step_before": old_max,
        "first_step_after": first_new_step,
        "first_step_at_size_pid": first.pid,
        "first_step_at_size_node": first.node,
        "in_flight_steps_after_event": len({s.step for s in old if s.t > t_event}),
    }


def first_step_of(steps: Iterable[Step], pid: int, after: float = 0.0) -> Step | None:
    """The first step `pid` completed after `after`."""
    mine = [s for s in steps if s.pid == pid and s.t > after]
    return min(mine, key=lambda s: s.t) if mine else None


def summarize(values: list[float]) -> dict[str, Any]:
    """median/min/max/n of a list of numbers (None for an empty list)."""
    if not values:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "n": len(values)}
