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
    """The report of the job whose ledger is in `ledger_dir`."""
    events = [e for e in _read_jsonl(ledger_dir / "events.jsonl") if e.get("event") == "generation"]
    ledgers = load_ledgers(ledger_dir)
    start_of = {e["generation"]: int(e["start_step"]) for e in events}
    numbers = sorted(start_of)

    def in_lineage(g: int, s: int) -> bool:
        later = [n for n in numbers if n > g]
        return s < start_of[later[0]] if later else True

    committed: set[tuple[int, int]] = set()
    commit_times: dict[int, list[float]] = defaultdict(list)
    for records in ledgers.values():
        for r in records:
            if r["k"] == "c":
                commit_times[r["g"]].append(r["t"])
                if in_lineage(r["g"], r["s"]):
                    committed.add((r["g"], r["s"]))

    epoch_counts: dict[int, Counter[int]] = defaultdict(Counter)
    per_gen_worker: dict[int, Counter[str]] = defaultdict(Counter)
    replayed: Counter[int] = Counter()
    pids: dict[str, set[int]] = defaultdict(set)
    for worker, records in ledgers.items():
        for r in records:
            if r["k"] == "g":
                pids[r.get("w", worker)].add(int(r["pid"]))
            elif r["k"] == "p":
                if (r["g"], r["s"]) in committed:
                    epoch_counts[r["e"]].update(r["i"])
                    per_gen_worker[r["g"]][worker] += len(r["i"])
                else:
                    replayed[r["g"]] += len(r["i"])

    generations = []
    previous_last_commit: float | None = None
    for e in events:
        g = e["generation"]
        times = sorted(commit_times.get(g, []))
        first = times[0] if times else None
        pause = 0.0
        if previous_last_commit is not None and first is not None:
            pause = max(0.0, first - previous_last_commit)
        steps = sum(1 for (gg, _) in committed if gg == g)
        lost = (
            sum(
                1
                for r in ledgers.values()
                for x in r
                if x["k"] == "c" and x["g"] == g - 1 and not in_lineage(x["g"], x["s"])
            )
            if g > 0
            else 0
        )
        generations.append(
            {
                "generation": g,
                "world_size": e["world_size"],
                "cause": e["cause"],
                "steps": steps,
                "start_step": e["start_step"],
                "pause_s": round(pause, 3),
                "detect_to_formed_s": round(e["formed_at"] - e["requested_at"], 3),
                "samples_per_worker": dict(sorted(per_gen_worker[g].items())),
                "members": e["members"],
                "steps_lost": lost,
                "samples_replayed": replayed[g - 1] if g > 0 else 0,
            }
        )
        if times:
            previous_last_commit = times[-1]

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
    unchanged = all(pids.get(w, {pid}) == {pid} for w, pid in first_members.items())
    return {
        "generations": generations,
        "epochs": epochs,
        "surviving_worker_pids_unchanged": unchanged and all(len(p) == 1 for p in pids.values()),
        "worker_pids": {w: sorted(p) for w, p in sorted(pids.items())},
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
