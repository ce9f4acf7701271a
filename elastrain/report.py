"""Turn a job's ledger directory into a report: generations, pauses, exactly-once counts per epoch.

Counts come from the sample indices each worker recorded for the steps that made it into the final
training state ("the lineage"), not from the sampler's arithmetic. A step committed in generation g
is in the lineage when it lies below the step generation g+1 started from; steps above it were
rolled back (their samples are counted as replayed, not as processed).
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

from elastrain.contracts.ledger import RecordKind
from elastrain.rendezvous.journal import EventKind


def _read_jsonl(path: Path) -> list[dict[str, Any]]:
    records = []
    if path.exists():
        for line in path.read_text().splitlines():
            line = line.strip()
            if line:
                try:
                    records.append(json.loads(line))
                except json.JSONDecodeError:
                    continue  # a torn last line of a killed worker
    return records


def load_ledgers(ledger_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """worker id -> its records."""
    out = {}
    for path in sorted(ledger_dir.glob("*.jsonl")):
        if path.name != "events.jsonl":
            out[path.stem] = _read_jsonl(path)
    return out


def build_report(ledger_dir: Path, num_samples: int) -> dict[str, Any]:
    """The report of the job (one or more runs, e.g. killed and resumed) whose ledger is in `ledger_dir`."""
    events = [e for e in _read_jsonl(ledger_dir / "events.jsonl") if e.get("event") == EventKind.GENERATION]
    ledgers = load_ledgers(ledger_dir)
    order = [(e.get("run", ""), e["generation"]) for e in events]
    start_of = {(e.get("run", ""), e["generation"]): int(e["start_step"]) for e in events}
    for records in ledgers.values():
        for r in records:
            # written after the state sync: the step the generation really started from
            if r["k"] == RecordKind.GENERATION:
                start_of[(r.get("run", ""), r["g"])] = int(r["s"])
    # a step is in the lineage when no later generation started from a step at or below it
    next_start: dict[tuple[str, int], int] = {}
    lowest_later: int | None = None
    for key in reversed(order):
        if lowest_later is not None:
            next_start[key] = lowest_later
        lowest_later = start_of[key] if lowest_later is None else min(lowest_later, start_of[key])

    def in_lineage(key: tuple[str, int], s: int) -> bool:
        return s < next_start[key] if key in next_start else True

    committed: set[tuple[str, int, int]] = set()
    commit_times: dict[tuple[str, int], list[float]] = defaultdict(list)
    lost: Counter[tuple[str, int]] = Counter()
    for records in ledgers.values():
        for r in records:
            if r["k"] == RecordKind.COMMITTED:
                key = (r.get("run", ""), r["g"])
                commit_times[key].append(r["t"])
                if in_lineage(key, r["s"]):
                    committed.add((*key, r["s"]))
                else:
                    lost[key] += 1

    epoch_counts: dict[int, Counter[int]] = defaultdict(Counter)
    per_gen_worker: dict[tuple[str, int], Counter[str]] = defaultdict(Counter)
    replayed: Counter[tuple[str, int]] = Counter()
    pids: dict[tuple[str, str], set[int]] = defaultdict(set)
    for worker, records in ledgers.items():
        for r in records:
            run = r.get("run", "")
            if r["k"] == RecordKind.GENERATION:
                pids[(run, r.get("w", worker))].add(int(r["pid"]))
            elif r["k"] == RecordKind.PROCESSED:
                if (run, r["g"], r["s"]) in committed:
                    epoch_counts[r["e"]].update(r["i"])
                    per_gen_worker[(run, r["g"])][worker] += len(r["i"])
                else:
                    replayed[(run, r["g"])] += len(r["i"])

    generations = []
    world_of = {(e.get("run", ""), e["generation"]): max(1, int(e["world_size"])) for e in events}
    previous: tuple[str, int] | None = None
    for e in events:
        key = (e.get("run", ""), e["generation"])
        times = sorted(commit_times.get(key, []))
        pause = 0.0
        if previous is not None and times and commit_times.get(previous):
            pause = max(0.0, times[0] - max(commit_times[previous]))
        generations.append(
            {
                "run": key[0],
                "generation": key[1],
                "world_size": e["world_size"],
                "cause": e["cause"],
                "steps": sum(1 for c in committed if c[:2] == key),
                "start_step": start_of[key],
                "pause_s": round(pause, 3),
                "detect_to_formed_s": round(e["formed_at"] - e["requested_at"], 3),
                "samples_per_worker": dict(sorted(per_gen_worker[key].items())),
                "members": e["members"],
                # steps the previous generation committed but rolled back, and in-flight samples redone
                "steps_lost": -(-lost[previous] // world_of[previous]) if previous else 0,
                "samples_replayed": replayed[previous] if previous else 0,
            }
        )
        if times:
            previous = key

    epochs = []
    for epoch in sorted(epoch_counts):
        counts = epoch_counts[epoch]
        total = sum(counts.values())
        epochs.append(
            {
                "epoch": epoch,
                "samples": total,
                "unique": len(counts),
                "duplicates": total - len(counts),
                "missing": num_samples - len([i for i in counts if 0 <= i < num_samples]),
            }
        )
    first_members = {m["worker_id"]: m["pid"] for g in events[:1] for m in g["members"]}
    first_run = events[0].get("run", "") if events else ""
    unchanged = all(pids.get((first_run, w), {pid}) == {pid} for w, pid in first_members.items())
    return {
        "generations": generations,
        "epochs": epochs,
        "surviving_worker_pids_unchanged": unchanged and all(len(p) == 1 for p in pids.values()),
        "worker_pids": {
            f"{w}" if not run else f"{run}/{w}": sorted(p) for (run, w), p in sorted(pids.items())
        },
    }


def format_report(report: dict[str, Any]) -> str:
    """A human-readable rendering of `build_report`'s output."""
    lines = ["generation  world  cause           steps  pause_s  samples per worker"]
    for g in report["generations"]:
        per = ", ".join(f"{w}={n}" for w, n in g["samples_per_worker"].items())
        lines.append(
            f"{g['generation']:>10}  {g['world_size']:>5}  {g['cause']:<14}  {g['steps']:>5}  "
            f"{g['pause_s']:>7.3f}  {per}"
        )
    lines.append("")
    lines.append("epoch  samples  duplicates  missing")
    for e in report["epochs"]:
        lines.append(f"{e['epoch']:>5}  {e['samples']:>7}  {e['duplicates']:>10}  {e['missing']:>7}")
    lines.append("")
    lines.append(f"surviving worker PIDs unchanged: {report['surviving_worker_pids_unchanged']}")
    if "test_accuracy" in report:
        lines.append(f"test accuracy: {report['test_accuracy']:.4f}")
    return "\n".join(lines)
