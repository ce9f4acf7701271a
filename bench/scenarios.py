"""The measurements: steady-state step time, and a job driven through failure, scale-in, scale-out.

Each function starts jobs, acts on them, waits (with timeouts, never forever) for what the step log
shows, and returns raw per-run records. Nothing here asserts anything about the figures.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from jobs import ElastrainJob, Timeouts, TrainingJob
from steplog import LogReader, event_figures, first_step_of, steady_step_time

from elastrain.testing.waits import poll

START_WORLD = {"failure": 3, "scale_in": 3, "scale_out": 2}
EVENTS = ("failure", "scale_in", "scale_out")


@dataclass
class Plan:
    """Step counts and time bounds of one benchmark invocation."""

    warmup_steps: int = 15  # steps at a world size before measuring or acting
    steady_window: int = 100  # steps whose intervals make the steady-state figure
    after_steps: int = 12  # steps at the new size that end an event
    checkpoint_every: int = 100  # torchrun script's checkpoint interval (its default)
    stuck_s: float = 20.0  # a restarted worker this long in init_process_group is hung
    timeouts: Timeouts = field(default_factory=Timeouts)


def _status(job: TrainingJob) -> str:
    return "hung" if job.alive() else "died"


def measure_steady(job: TrainingJob, plan: Plan, repeat: int) -> dict[str, Any]:
    """Steady-state step time at world 2 (rank 0's median interval over the same window)."""
    record: dict[str, Any] = {"measurement": "steady", "system": job.system, "repeat": repeat, "status": "ok"}
    need = plan.warmup_steps + plan.steady_window + 1
    try:
        job.start(2)
        timeout = plan.timeouts.start_s + need * 0.5
        done = poll(lambda: job.reader.poll().max_step() >= need, timeout, 0.5, abort=lambda: not job.alive())
        if not done:
            record["status"] = _status(job)
            record["note"] = f"did not reach step {need} within {timeout:.0f}s"
        record.update(steady_step_time(job.reader.poll().steps, plan.warmup_steps, plan.steady_window))
    finally:
        record["stop"] = job.stop(plan.timeouts.stop_s)
    return record


def _current_step(reader: LogReader) -> int:
    latest = max(reader.steps, key=lambda s: s.t, default=None)
    return latest.step if latest is not None else -1


def _new_steps(reader: LogReader, t_event: float, world: int | None) -> int:
    old = {s.config for s in reader.steps if s.t <= t_event}
    return len(
        {
            s.step
            for s in reader.steps
            if s.t > t_event and s.config not in old and (world is None or s.world == world)
        }
    )


def _wait_new_steps(
    job: TrainingJob, t: float, world: int | None, count: int, timeout_s: float, stuck_s: float | None
) -> bool:
    """Wait for `count` steps of new configurations after `t`; False on timeout, death or a hang."""

    def done() -> bool:
        return _new_steps(job.reader.poll(), t, world) >= count

    def give_up() -> bool:
        return not job.alive() or (stuck_s is not None and bool(_stuck(job.reader, t, stuck_s)))

    return poll(done, timeout_s, 0.1, abort=give_up)


def _stuck(reader: LogReader, t_event: float, stuck_s: float) -> list[dict[str, Any]]:
    """Processes started after `t_event` that sit in init_process_group longer than `stuck_s`.

    torchrun's restarted workers log "checkpoint" just before ``init_process_group``, which takes
    well under a second when the rendezvous handed out a usable MASTER_ADDR/PORT; sitting there for
    `stuck_s` means they wait for a store that never answers (torchrun's DEFAULT settings).
    """
    now = time.time()
    started = {m.pid for m in reader.marks if m.name == "start" and m.t > t_event}
    out = []
    for pid in started:
        marks = reader.marks_of(pid)
        last = max(marks, key=lambda name: marks[name])
        if last == "checkpoint" and now - marks[last] > stuck_s:
            out.append({"pid": pid, "last_mark": last, "for_s": round(now - marks[last], 1)})
    return out


def _wait_phase(job: TrainingJob, plan: Plan) -> None:
    """Wait until the job is half-way between two checkpoints (the expected loss of a random event)."""
    half = plan.checkpoint_every // 2
    poll(
        lambda: _current_step(job.reader.poll()) % plan.checkpoint_every >= half,
        plan.checkpoint_every * job.reader.step_time() * 3 + 5,
        0.05,
        abort=lambda: not job.alive(),
    )


def _act(job: TrainingJob, event: str, record: dict[str, Any]) -> tuple[float, int | None]:
    """Perform `event`; returns (time of the request, world size that ends it or None for any)."""
    world = job.reader.poll().current_world()
    if event == "failure":
        t, pid = job.kill_worker()
        record["killed_pid"] = pid
        record["killed_node"] = job.nodes[-1]
        return t, None
    if event == "scale_in":
        record["removed_node"] = job.nodes[-1]
        return job.scale_in(), world - 1
    t = job.scale_out()
    record["added_node"] = job.nodes[-1]
    return t, world + 1


def run_events(
    system: str,
    factory: Callable[[str], TrainingJob],
    plan: Plan,
    repeat: int,
    events: tuple[str, ...] = EVENTS,
) -> list[dict[str, Any]]:
    """Drive jobs of `system` through every event once (a fresh job whenever the last one is unfit)."""
    records: list[dict[str, Any]] = []
    remaining = list(events)
    job: TrainingJob | None = None
    jobs_started = 0
    try:
        while remaining:
            current = job.reader.poll().current_world() if job is not None and job.alive() else 0
            event = next((e for e in remaining if START_WORLD[e] == current), remaining[0])
            remaining.remove(event)
            world = START_WORLD[event]
            record: dict[str, Any] = {
                "measurement": event,
                "system": system,
                "repeat": repeat,
                "status": "ok",
            }
            records.append(record)
            if job is None or current != world:
                if job is not None:
                    record["note"] = "started a fresh job: the previous one ended or is at another size"
                    record["previous_job_stop"] = job.stop(plan.timeouts.stop_s)
                jobs_started += 1
                job = factory(f"{system}-r{repeat}-j{jobs_started}")
                t0 = time.time()
                job.start(world)
                up = _wait_new_steps(job, t0, world, plan.warmup_steps, plan.timeouts.start_s, None)
                record["job_start_s"] = time.time() - t0
                if not up:
                    record["status"] = _status(job)
                    record["note"] = f"the job did not reach {plan.warmup_steps} steps at world {world}"
                    job.kill()
                    job = None
                    continue
            record["job"] = job.job.name
            if system.startswith("torchrun"):
                _wait_phase(job, plan)
            t_event, new_world = _act(job, event, record)
            ended = _wait_new_steps(
                job, t_event, new_world, plan.after_steps, plan.timeouts.event_s, plan.stuck_s
            )
            record.update(
                event_figures(job.reader.poll().steps, t_event, new_world or 0, plan.after_steps)
                if new_world
                else _any_world_figures(job.reader, t_event, plan.after_steps)
            )
            if not ended:
                record["status"] = _status(job)
                record["stuck"] = _stuck(job.reader, t_event, plan.stuck_s)
                if record["stuck"]:
                    why = f"restarted workers stuck in init_process_group for {plan.stuck_s:.0f}s"
                elif record["status"] == "died":
                    why = "the job ended"
                else:
                    why = f"no {plan.after_steps} new steps within {plan.timeouts.event_s:.0f}s"
                record["note"] = f"{why} after the {event}"
                job.kill()
                job = None
                continue
            if event == "scale_out":
                record["breakdown"] = breakdown(job, t_event)
    finally:
        if job is not None and records:
            records[-1]["stop"] = job.stop(plan.timeouts.stop_s)
    return records


def _any_world_figures(reader: LogReader, t_event: float, after: int) -> dict[str, Any]:
    """event_figures at the world size of the first new configuration (failure: any size)."""
    old = {s.config for s in reader.steps if s.t <= t_event}
    new = sorted((s for s in reader.steps if s.t > t_event and s.config not in old), key=lambda s: s.t)
    world = new[0].world if new else 0
    figures = event_figures(reader.steps, t_event, world, after)
    figures["world_after"] = world
    return figures


def _segments(points: list[tuple[str, float | None]], t_ref: float) -> dict[str, Any]:
    """Marks relative to `t_ref` and the durations between consecutive known marks."""
    known = [(name, t) for name, t in points if t is not None]
    return {
        "marks_s": {name: round(t - t_ref, 4) for name, t in known},
        "segments_s": {f"{a}->{b}": round(tb - ta, 4) for (a, ta), (b, tb) in itertools.pairwise(known)},
        "missing": [name for name, t in points if t is None],
    }


def breakdown(job: TrainingJob, t_event: float) -> dict[str, Any]:
    """Where the time of a scale-out went: the new node's worker, and a surviving node's worker."""
    reader = job.reader.poll()
    out: dict[str, Any] = {}
    new_steps = sorted(
        (s for s in reader.steps if s.node == job.nodes[-1] and s.t > t_event), key=lambda s: s.t
    )
    old_pids = {s.pid for s in reader.steps if s.t <= t_event}
    survivor_steps = sorted((s for s in reader.steps if s.node == job.nodes[0]), key=lambda s: s.t)
    extra = job.extra_figures()
    if not new_steps:
        return {"error": "the new node never completed a step"}
    new_pid = new_steps[0].pid
    marks = reader.marks_of(new_pid)
    if isinstance(job, ElastrainJob):
        gen = next((g for g in extra["generations"] if any(m["pid"] == new_pid for m in g["members"])), None)
        g_number = gen["generation"] if gen else -1
        formed = gen["formed_at"] if gen else None
        joins = {(j["pid"], j["g"]): j["t"] for j in extra["joins"]}
        out["new_worker"] = _segments(
            [
                ("request", t_event),
                ("script_start", marks.get("start")),
                ("imported", marks.get("import")),
                ("data_built", marks.get("data")),
                ("model_built", marks.get("model")),
                ("optimizer_built", marks.get("optimizer")),
                ("connected", marks.get("init")),
                ("announced", gen["requested_at"] if gen else None),
                ("generation_formed", formed),
                ("group_built", _mark_after(reader, new_pid, "pg", formed)),
                ("state_received", _enter(reader, new_pid, g_number)),
                ("first_step", new_steps[0].t),
            ],
            t_event,
        )
        out["new_worker"]["ledger_g_record_s"] = _rel(joins.get((new_pid, g_number)), t_event)
        survivor_old = [s for s in survivor_steps if s.gen < g_number]
        survivor_new = [s for s in survivor_steps if s.gen == g_number]
        if survivor_old and survivor_new:
            pid = survivor_new[0].pid
            out["survivor"] = _segments(
                [
                    ("last_old_step", survivor_old[-1].t),
                    ("generation_formed", formed),
                    ("group_built", _mark_after(reader, pid, "pg", formed)),
                    ("state_received", _enter(reader, pid, g_number)),
                    ("first_step", survivor_new[0].t),
                ],
                t_event,
            )
            out["survivor"]["ledger_g_record_s"] = _rel(joins.get((pid, g_number)), t_event)
        out["generation"] = gen
    else:
        out["new_worker"] = _segments(
            [
                ("request", t_event),
                ("script_start", marks.get("start")),
                ("imported", marks.get("import")),
                ("data_built", marks.get("data")),
                ("model_built", marks.get("model")),
                ("optimizer_built", marks.get("optimizer")),
                ("checkpoint_loaded", marks.get("checkpoint")),
                ("process_group", marks.get("pg")),
                ("ddp_ready", marks.get("enter")),
                ("first_step", new_steps[0].t),
            ],
            t_event,
        )
        old = [s for s in survivor_steps if s.pid in old_pids]
        fresh = [s for s in survivor_steps if s.pid not in old_pids and s.t > t_event]
        if old and fresh:
            pid = fresh[0].pid
            m = reader.marks_of(pid)
            first = first_step_of(reader.steps, pid)
            out["survivor"] = _segments(
                [
                    ("last_old_step", old[-1].t),
                    ("script_start", m.get("start")),
                    ("imported", m.get("import")),
                    ("data_built", m.get("data")),
                    ("model_built", m.get("model")),
                    ("optimizer_built", m.get("optimizer")),
                    ("checkpoint_loaded", m.get("checkpoint")),
                    ("process_group", m.get("pg")),
                    ("ddp_ready", m.get("enter")),
                    ("first_step", first.t if first else None),
                ],
                t_event,
            )
    return out


def _rel(t: float | None, t_ref: float) -> float | None:
    return None if t is None else round(t - t_ref, 4)


def _mark_after(reader: LogReader, pid: int, name: str, after: float | None) -> float | None:
    """The first `name` mark of `pid` at or after `after` (None when absent)."""
    if after is None:
        return None
    times = [m.t for m in reader.marks if m.pid == pid and m.name == name and m.t >= after - 0.001]
    return min(times) if times else None


def _enter(reader: LogReader, pid: int, generation: int) -> float | None:
    """When `pid` entered the training function in `generation` (state received)."""
    times = [
        m.t for m in reader.marks if m.pid == pid and m.name == "enter" and m.extra.get("gen") == generation
    ]
    return min(times) if times else None
