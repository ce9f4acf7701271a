"""`elastrain.launcher.slurm_grow` and the watched `SlurmHosts`, with a fake Slurm (no daemons)."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

import pytest

from elastrain.hostfile import Host, Hostfile
from elastrain.launcher.hosts import SlurmHosts, make_host_source
from elastrain.launcher.slurm_grow import AllocationGrower, idle_nodes, job_nodes, resize_env


class FakeSlurm:
    """Answers scontrol/sinfo/salloc/scancel as a one-partition cluster whose job 7 can grow once."""

    def __init__(self, job_nodes: list[str], idle: list[str]) -> None:
        self.job = list(job_nodes)
        self.idle = list(idle)
        self.calls: list[tuple[str, ...]] = []
        self.helper: list[str] = []
        self.resized = False
        self.salloc_error = ""

    def __call__(self, *argv: str, timeout: float = 15.0) -> subprocess.CompletedProcess[str]:
        self.calls.append(argv)
        out, err, code = "", "", 0
        if argv[:3] == ("scontrol", "show", "job"):
            nodes = ",".join(self.job)
            out = f"JobId=7 JobState=RUNNING Partition=p ReqNodeList=(null) NodeList={nodes} NumNodes=2\n"
        elif argv[0] == "sinfo":
            out = "".join(f"{n}\n" for n in self.idle)
        elif argv[0] == "salloc":
            if self.salloc_error:
                return subprocess.CompletedProcess(argv, 1, "", self.salloc_error)
            wanted = next(a for a in argv if a.startswith("--nodelist=")).split("=", 1)[1].split(",")
            self.helper = wanted
            self.idle = [n for n in self.idle if n not in wanted]
            err = "salloc: Granted job allocation 8\n"
        elif argv[:2] == ("scontrol", "update") and argv[2] == "jobid=7":
            if self.resized:
                return subprocess.CompletedProcess(argv, 1, "", "Job update not available right now")
            self.job += self.helper
            self.resized = True
        return subprocess.CompletedProcess(argv, code, out, err)


def grower(slurm: FakeSlurm, max_np: int, now: list[float], slots: int = 1) -> AllocationGrower:
    return AllocationGrower(
        "7",
        "p",
        slots,
        max_np,
        settle_s=3.0,
        max_settle_s=10.0,
        runner=slurm,
        clock=lambda: now[0],
        environ={},
    )


def test_parsers() -> None:
    slurm = FakeSlurm(["w-0", "w-1"], ["w-3", "w-2"])
    assert job_nodes("7", slurm) == ["w-0", "w-1"]
    assert idle_nodes("p", slurm) == ["w-2", "w-3"]
    assert "--partition=p" in slurm.calls[-1]
    assert job_nodes("7", lambda *a, **k: None) is None
    assert idle_nodes("p", lambda *a, **k: None) == []


def test_resize_env(tmp_path: Path) -> None:
    (tmp_path / "slurm_job_7_resize.sh").write_text(
        'export SLURM_NODELIST="w-[0-3]"\nexport SLURM_JOB_NUM_NODES="4"\n'
        'export SLURM_TASKS_PER_NODE="1(x4)"\n'
    )
    assert resize_env("7", str(tmp_path)) == {
        "SLURM_NODELIST": "w-[0-3]",
        "SLURM_JOB_NUM_NODES": "4",
        "SLURM_TASKS_PER_NODE": "1(x4)",
    }
    assert resize_env("8", str(tmp_path)) == {}


def test_grows_once_by_every_idle_node_it_can_use() -> None:
    slurm, now = FakeSlurm(["w-0", "w-1"], ["w-2", "w-3", "w-4"]), [0.0]
    g = grower(slurm, max_np=4, now=now)
    assert g.needed(["w-0", "w-1"]) == 2
    assert g.poll(["w-0", "w-1"]) == ["w-2", "w-3"]  # enough nodes at once: no settle wait
    salloc = next(c for c in slurm.calls if c[0] == "salloc")
    assert "--dependency=expand:7" in salloc and "--nodes=2" in salloc and "--no-shell" in salloc
    updates = [c for c in slurm.calls if c[:2] == ("scontrol", "update")]
    assert updates == [
        ("scontrol", "update", "jobid=8", "NumNodes=0"),
        ("scontrol", "update", "jobid=7", "NumNodes=ALL"),
    ]
    assert ("scancel", "8") in slurm.calls
    assert slurm.job == ["w-0", "w-1", "w-2", "w-3"] and g.done
    # the once-only resize: later idle nodes are left alone, even below max_np
    slurm.idle = ["w-9"]
    calls = len(slurm.calls)
    assert g.poll(["w-0"]) == [] and len(slurm.calls) == calls


def test_waits_for_the_settle_window_before_growing_by_fewer_nodes() -> None:
    slurm, now = FakeSlurm(["w-0", "w-1"], ["w-2"]), [0.0]
    g = grower(slurm, max_np=4, now=now)
    assert g.poll(["w-0", "w-1"]) == []
    now[0] = 2.0
    slurm.idle = ["w-2", "w-3", "w-4"]  # more of the same scale-out: enough now
    assert g.poll(["w-0", "w-1"]) == ["w-2", "w-3"]

    slurm, now = FakeSlurm(["w-0", "w-1"], ["w-2"]), [0.0]
    g = grower(slurm, max_np=4, now=now)
    assert g.poll(["w-0", "w-1"]) == []
    now[0] = 2.9
    assert g.poll(["w-0", "w-1"]) == []
    now[0] = 3.0  # settled: grow by what there is
    assert g.poll(["w-0", "w-1"]) == ["w-2"]


def test_slots_per_node_and_max_np_bound_the_growth() -> None:
    slurm, now = FakeSlurm(["w-0"], ["w-1", "w-2", "w-3"]), [0.0]
    g = grower(slurm, max_np=5, now=now, slots=2)  # 2 slots on w-0, 3 more wanted: 2 nodes
    assert g.needed(["w-0"]) == 2 and g.poll(["w-0"]) == ["w-1", "w-2"]
    slurm, now = FakeSlurm(["w-0", "w-1"], ["w-2"]), [0.0]
    g = grower(slurm, max_np=2, now=now)
    assert g.poll(["w-0", "w-1"]) == [] and not any(c[0] == "sinfo" for c in slurm.calls)


def test_a_failed_salloc_is_retried_then_given_up() -> None:
    slurm, now = FakeSlurm(["w-0", "w-1"], ["w-2", "w-3"]), [0.0]
    slurm.salloc_error = "salloc: error: Unable to allocate resources: Requested nodes are busy"
    g = grower(slurm, max_np=4, now=now)
    for attempt in range(3):
        assert g.poll(["w-0", "w-1"]) == []
        assert g.done == (attempt == 2)
    assert slurm.job == ["w-0", "w-1"]


def test_slurm_hosts_follows_the_nodelist_and_grows_only_with_max_np() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "w-[0-1]", "SLURM_JOB_PARTITION": "p"}
    slurm = FakeSlurm(["w-0", "w-1"], ["w-2", "w-3"])
    fixed = SlurmHosts(env, runner=slurm)
    assert fixed.grower is None  # -np N / no --max-np: never expands
    assert SlurmHosts(env, max_np=2, runner=slurm).grower is None  # already at --max-np
    hosts = SlurmHosts(env, nproc_per_node=2, max_np=8, runner=slurm)
    assert hosts.grower is not None and hosts.grower.slots_per_node == 2
    assert hosts.read() == Hostfile((Host("w-0", 2), Host("w-1", 2)))
    slurm.job += ["w-2"]
    assert hosts.read() == Hostfile((Host("w-0", 2), Host("w-1", 2), Host("w-2", 2)))
    unreadable = SlurmHosts(env, runner=lambda *a, **k: None)  # slurmctld restarting: keep the last list
    assert unreadable.read().slots_by_host() == {"w-0": 1, "w-1": 1}


def test_slurm_hosts_watch_reports_the_grown_allocation() -> None:
    env = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "w-[0-1]", "SLURM_JOB_PARTITION": "p"}
    slurm = FakeSlurm(["w-0", "w-1"], ["w-2", "w-3"])
    hosts = SlurmHosts(env, max_np=4, runner=slurm)
    assert hosts.grower is not None
    hosts.grower.environ = {}
    seen: list[Hostfile] = []
    stop = threading.Event()
    thread = threading.Thread(target=hosts.watch, args=(lambda h: (seen.append(h), stop.set()), stop, 0.01))
    thread.start()
    thread.join(10)
    stop.set()
    assert seen and seen[0].slots_by_host() == {"w-0": 1, "w-1": 1, "w-2": 1, "w-3": 1}


def test_make_host_source_passes_max_np(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "w-0")
    monkeypatch.delenv("SLURM_NTASKS_PER_NODE", raising=False)
    monkeypatch.delenv("SLURM_TASKS_PER_NODE", raising=False)
    monkeypatch.delenv("SLURM_NTASKS", raising=False)
    monkeypatch.delenv("SLURM_NPROCS", raising=False)
    source = make_host_source(None, None, None, None, None, slurm=True, max_np=3)
    assert isinstance(source, SlurmHosts) and source.grower is not None and source.grower.max_np == 3
    assert make_host_source(None, None, None, None, 1, slurm=True).grower is None  # type: ignore[attr-defined]
