"""build_report over small synthetic ledgers: exactly-once counts, rollbacks, pauses, worker PIDs."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

from elastrain.report import build_report, format_report


class FakeJob:
    """Writes ledger files in the format of `elastrain.runtime.ledger` and the coordinator's events."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.records: dict[str, list[dict[str, Any]]] = defaultdict(list)
        self.events: list[dict[str, Any]] = []
        self.pids: dict[str, int] = {}

    def generation(
        self,
        g: int,
        workers: dict[str, int],
        start_step: int,
        *,
        cause: str = "start",
        requested_at: float = 0.0,
        formed_at: float | None = None,
    ) -> None:
        """Generation `g` of `workers` (worker id -> pid) starts from `start_step`."""
        formed = requested_at if formed_at is None else formed_at
        self.events.append(
            {
                "event": "generation",
                "generation": g,
                "cause": cause,
                "world_size": len(workers),
                "members": [{"worker_id": w, "host": "127.0.0.2", "pid": pid} for w, pid in workers.items()],
                "start_step": start_step,
                "requested_at": requested_at,
                "formed_at": formed,
            }
        )
        for rank, (w, pid) in enumerate(workers.items()):
            record = {"k": "g", "g": g, "r": rank, "ws": len(workers), "s": start_step, "cause": cause}
            self.records[w].append({**record, "pid": pid, "w": w, "t": formed})

    def processed(self, worker: str, g: int, e: int, s: int, indices: list[int], t: float = 0.0) -> None:
        self.records[worker].append({"k": "p", "g": g, "e": e, "s": s, "i": indices, "t": t})

    def committed(self, worker: str, g: int, e: int, s: int, t: float = 0.0, ws: int = 1) -> None:
        self.records[worker].append({"k": "c", "g": g, "e": e, "s": s, "ws": ws, "t": t})

    def step(
        self, g: int, e: int, s: int, shares: dict[str, list[int]], t: float = 0.0, commit: bool = True
    ) -> None:
        """Every worker in `shares` processes its share of step `s`; then (if `commit`) all commit it."""
        for w, indices in shares.items():
            self.processed(w, g, e, s, indices, t)
        if commit:
            for w in shares:
                self.committed(w, g, e, s, t, ws=len(shares))

    def write(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        for worker, records in self.records.items():
            (self.root / f"{worker}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        events = [*self.events, {"event": "end", "success": True, "message": "done", "at": 99.0}]
        (self.root / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
        return self.root


def epoch(report: dict[str, Any], number: int) -> dict[str, Any]:
    (found,) = [e for e in report["epochs"] if e["epoch"] == number]
    return found


def gen(report: dict[str, Any], number: int) -> dict[str, Any]:
    (found,) = [g for g in report["generations"] if g["generation"] == number]
    return found


def test_clean_run_is_exactly_once(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 100, "w1": 101}, 0, requested_at=1.0, formed_at=1.25)
    job.step(0, 0, 0, {"w0": [0, 1], "w1": [2, 3]}, t=2.0)
    job.step(0, 0, 1, {"w0": [4, 5], "w1": [6, 7]}, t=3.0)
    job.step(0, 1, 2, {"w0": [7, 6], "w1": [5, 4]}, t=4.0)
    job.step(0, 1, 3, {"w0": [3, 2], "w1": [1, 0]}, t=5.0)
    report = build_report(job.write(), num_samples=8)

    for e in (0, 1):
        assert epoch(report, e) == {"epoch": e, "samples": 8, "unique": 8, "duplicates": 0, "missing": 0}
    (g0,) = report["generations"]
    assert g0["generation"] == 0
    assert g0["world_size"] == 2
    assert g0["cause"] == "start"
    assert g0["steps"] == 4
    assert g0["start_step"] == 0
    assert g0["pause_s"] == 0.0
    assert g0["detect_to_formed_s"] == 0.25
    assert g0["samples_per_worker"] == {"w0": 8, "w1": 8}
    assert [m["worker_id"] for m in g0["members"]] == ["w0", "w1"]
    assert g0["steps_lost"] == 0
    assert g0["samples_replayed"] == 0
    assert report["surviving_worker_pids_unchanged"] is True
    assert report["worker_pids"] == {"w0": [100], "w1": [101]}


def test_duplicates_and_missing_are_counted(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1, "w1": 2}, 0)
    job.step(0, 0, 0, {"w0": [0, 1], "w1": [1, 2]})  # 1 twice
    job.step(0, 0, 1, {"w0": [3, 3], "w1": [0]})  # 3 twice, 0 again
    report = build_report(job.write(), num_samples=6)
    assert epoch(report, 0) == {"epoch": 0, "samples": 7, "unique": 4, "duplicates": 3, "missing": 2}


def test_missing_whole_epoch_is_visible(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1}, 0)
    job.step(0, 0, 0, {"w0": [0, 1, 2]})
    report = build_report(job.write(), num_samples=10)
    assert epoch(report, 0)["missing"] == 7
    assert [e["epoch"] for e in report["epochs"]] == [0]


def rollback_job(root: Path) -> FakeJob:
    """Generation 0 (w0, w1) commits steps 0-3; generation 1 (w0 alone) restarts from step 2.

    Steps 2 and 3 of generation 0 were rolled back (the survivor's committed state is at step 2), so
    their samples are replayed by generation 1 and only generation 1's copies are in the lineage.
    """
    job = FakeJob(root)
    job.generation(0, {"w0": 10, "w1": 11}, 0, requested_at=0.0, formed_at=0.5)
    job.step(0, 0, 0, {"w0": [0, 1], "w1": [2, 3]}, t=1.0)
    job.step(0, 0, 1, {"w0": [4, 5], "w1": [6, 7]}, t=2.0)
    job.step(0, 0, 2, {"w0": [8, 9], "w1": [10, 11]}, t=3.0)
    job.step(0, 0, 3, {"w0": [12, 13], "w1": [14, 15]}, t=4.0)
    job.generation(1, {"w0": 10}, 2, cause="failure", requested_at=4.5, formed_at=6.0)
    job.step(1, 0, 2, {"w0": [8, 9, 10, 11]}, t=7.0)
    job.step(1, 0, 3, {"w0": [12, 13, 14, 15]}, t=8.0)
    return job


def test_steps_above_the_next_generations_start_are_rolled_back(tmp_path: Path) -> None:
    report = build_report(rollback_job(tmp_path).write(), num_samples=16)
    assert epoch(report, 0) == {"epoch": 0, "samples": 16, "unique": 16, "duplicates": 0, "missing": 0}
    g0, g1 = gen(report, 0), gen(report, 1)
    assert g0["steps"] == 2  # steps 0 and 1; 2 and 3 were rolled back
    assert g1["steps"] == 2
    assert g0["samples_per_worker"] == {"w0": 4, "w1": 4}
    assert g1["samples_per_worker"] == {"w0": 8}
    assert g1["samples_replayed"] == 8  # generation 0's copies of steps 2 and 3
    assert g1["cause"] == "failure"
    assert g1["start_step"] == 2
    assert g1["world_size"] == 1
    assert g1["detect_to_formed_s"] == 1.5


def test_steps_lost_counts_steps_not_commit_records(tmp_path: Path) -> None:
    report = build_report(rollback_job(tmp_path).write(), num_samples=16)
    assert gen(report, 1)["steps_lost"] == 2


def test_restart_from_an_older_step_rolls_back_every_later_step(tmp_path: Path) -> None:
    """Generation 2 restarts from step 1 (say, a checkpoint): what came before it above step 1 is lost."""
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1}, 0)
    job.step(0, 0, 0, {"w0": [0]})
    job.step(0, 0, 1, {"w0": [1]})
    job.generation(1, {"w0": 1, "w1": 2}, 2, cause="grow")
    job.step(1, 0, 2, {"w0": [2], "w1": [3]})
    job.generation(2, {"w0": 5}, 1, cause="failure")  # every worker died; w0 restarted from step 1
    job.step(2, 0, 1, {"w0": [1]})
    job.step(2, 0, 2, {"w0": [2, 3]})
    report = build_report(job.write(), num_samples=4)
    assert epoch(report, 0) == {"epoch": 0, "samples": 4, "unique": 4, "duplicates": 0, "missing": 0}


def test_a_step_nobody_committed_is_not_counted(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1, "w1": 2}, 0)
    job.step(0, 0, 0, {"w0": [0, 1], "w1": [2, 3]}, t=1.0)
    job.step(0, 0, 1, {"w0": [4, 5], "w1": [6, 7]}, t=2.0, commit=False)  # both died mid-step
    job.generation(1, {"w0": 1, "w1": 3}, 1, cause="failure")
    job.step(1, 0, 1, {"w0": [4, 5], "w1": [6, 7]}, t=3.0)
    report = build_report(job.write(), num_samples=8)
    assert epoch(report, 0) == {"epoch": 0, "samples": 8, "unique": 8, "duplicates": 0, "missing": 0}
    assert gen(report, 0)["steps"] == 1
    assert gen(report, 1)["samples_replayed"] == 4
    assert gen(report, 1)["steps_lost"] == 0


def test_processed_without_commit_at_the_end_is_not_counted(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1}, 0)
    job.step(0, 0, 0, {"w0": [0, 1]})
    job.processed("w0", 0, 0, 1, [2, 3])  # killed before the commit
    report = build_report(job.write(), num_samples=4)
    assert epoch(report, 0) == {"epoch": 0, "samples": 2, "unique": 2, "duplicates": 0, "missing": 2}
    assert gen(report, 0)["steps"] == 1
    assert gen(report, 0)["samples_per_worker"] == {"w0": 2}


def test_one_commit_record_commits_the_step_for_every_worker(tmp_path: Path) -> None:
    """A worker killed after its gradients were all-reduced left its processed record but no commit."""
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1, "w1": 2}, 0)
    job.processed("w0", 0, 0, 0, [0, 1])
    job.processed("w1", 0, 0, 0, [2, 3])
    job.committed("w0", 0, 0, 0)
    job.generation(1, {"w0": 1}, 1, cause="failure")
    report = build_report(job.write(), num_samples=4)
    assert epoch(report, 0)["samples"] == 4
    assert gen(report, 0)["samples_per_worker"] == {"w0": 2, "w1": 2}


def test_pause_is_the_gap_between_generations_commits(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1, "w1": 2}, 0)
    job.step(0, 0, 0, {"w0": [0], "w1": [1]}, t=10.0)
    job.processed("w0", 0, 0, 1, [2])
    job.processed("w1", 0, 0, 1, [3])
    job.committed("w1", 0, 0, 1, t=11.0)
    job.committed("w0", 0, 0, 1, t=11.5)  # the last commit of generation 0
    job.generation(1, {"w0": 1, "w1": 2, "w2": 3}, 2, cause="grow", requested_at=11.0, formed_at=12.0)
    job.processed("w2", 1, 0, 2, [4])
    job.committed("w2", 1, 0, 2, t=14.0)
    job.committed("w0", 1, 0, 2, t=14.25)
    job.committed("w1", 1, 0, 2, t=14.0)  # the first commit of generation 1 (written out of order)
    report = build_report(job.write(), num_samples=5)
    assert gen(report, 0)["pause_s"] == 0.0
    assert gen(report, 1)["pause_s"] == 2.5
    assert gen(report, 1)["detect_to_formed_s"] == 1.0


def test_pause_skips_a_generation_without_commits(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1}, 0)
    job.step(0, 0, 0, {"w0": [0]}, t=5.0)
    job.generation(1, {"w0": 1, "w1": 2}, 1, cause="grow")  # fell apart before its first commit
    job.generation(2, {"w0": 1}, 1, cause="failure")
    job.step(2, 0, 1, {"w0": [1]}, t=9.0)
    report = build_report(job.write(), num_samples=2)
    assert gen(report, 1)["pause_s"] == 0.0
    assert gen(report, 1)["steps"] == 0
    assert gen(report, 2)["pause_s"] == 4.0
    assert epoch(report, 0)["missing"] == 0


def test_respawned_worker_means_pids_changed(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 100, "w1": 101}, 0)
    job.step(0, 0, 0, {"w0": [0], "w1": [1]})
    job.generation(1, {"w0": 100, "w1": 202}, 1, cause="failure")  # w1 was restarted as a new process
    job.step(1, 0, 1, {"w0": [2], "w1": [3]})
    report = build_report(job.write(), num_samples=4)
    assert report["surviving_worker_pids_unchanged"] is False
    assert report["worker_pids"] == {"w0": [100], "w1": [101, 202]}


def test_new_workers_joining_do_not_change_pids(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 100, "w1": 101}, 0)
    job.step(0, 0, 0, {"w0": [0], "w1": [1]})
    job.generation(1, {"w0": 100, "w1": 101, "w2": 300}, 1, cause="grow")
    job.step(1, 0, 1, {"w0": [2], "w1": [3], "w2": [4]})
    job.generation(2, {"w0": 100}, 2, cause="shrink")
    report = build_report(job.write(), num_samples=5)
    assert report["surviving_worker_pids_unchanged"] is True
    assert report["worker_pids"] == {"w0": [100], "w1": [101], "w2": [300]}


def test_torn_last_line_is_ignored(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1, "w1": 2}, 0)
    job.step(0, 0, 0, {"w0": [0, 1], "w1": [2, 3]}, t=1.0)
    job.processed("w0", 0, 0, 1, [4, 5])
    job.processed("w1", 0, 0, 1, [6, 7])
    root = job.write()
    for worker in ("w0", "w1"):  # both killed while writing the commit of step 1
        with open(root / f"{worker}.jsonl", "a") as f:
            f.write('{"k": "c", "g": 0, "e": 0, "s": 1, "ws": 2, "t": 2.')
    with open(root / "events.jsonl", "a") as f:
        f.write('{"event": "generation", "generation": 1, "cause": "fail')
    report = build_report(root, num_samples=8)
    assert epoch(report, 0) == {"epoch": 0, "samples": 4, "unique": 4, "duplicates": 0, "missing": 4}
    assert [g["generation"] for g in report["generations"]] == [0]
    assert gen(report, 0)["steps"] == 1


def test_blank_lines_are_ignored(tmp_path: Path) -> None:
    job = FakeJob(tmp_path)
    job.generation(0, {"w0": 1}, 0)
    job.step(0, 0, 0, {"w0": [0, 1]})
    root = job.write()
    text = (root / "w0.jsonl").read_text()
    (root / "w0.jsonl").write_text("\n\n" + text.replace("\n", "\n\n"))
    assert epoch(build_report(root, num_samples=2), 0)["samples"] == 2


def test_empty_ledger_directory(tmp_path: Path) -> None:
    report = build_report(tmp_path, num_samples=3)
    assert report["generations"] == []
    assert report["epochs"] == []
    assert report["surviving_worker_pids_unchanged"] is True


def test_format_report_shows_the_counts(tmp_path: Path) -> None:
    report = build_report(rollback_job(tmp_path).write(), num_samples=16)
    text = format_report(report)
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["generation", "world", "cause"]
    assert any(line.split()[:3] == ["1", "1", "failure"] for line in lines)
    assert any(line.split() == ["0", "16", "0", "0"] for line in lines)
    assert lines[-1] == "surviving worker PIDs unchanged: True"
