"""Issue 29 item 4: the server's data directory is not visible to a tenant.

The report: the data directory's path showed inside containers (``/proc/self/mountinfo`` names each bind
mount's source) and in refusals made from host paths. Replayed: (1) on the process backend, bob turns
his running job's log into a FIFO, so the server refuses it: the refusal, his cluster's ``Degraded``
reason, its events and every other answer bob gets name ``DATA-DIR/...`` at most, never the path; and a
host-path mount refused at start names the storage area as ``storage:NAME``. (2) On the container
backend with the data directory a filesystem of its own (as the README says to deploy), nothing a
process in bob's container reads (mountinfo, its environment, its init's) holds the path, and the
server does not warn; with the data directory below a filesystem's root the server warns at start.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import httpx
import pytest

from elastrain.testing.containers import container_plane, framework_image, need_podman
from elastrain.testing.waits import wait_until
from tests.security.harness import new_user, start_server
from tests.security.test_tenant_files import cluster_state, running_cluster, submit_job

pytestmark = pytest.mark.timeout(600)
MOUNTINFO_WARNING = "/proc/self/mountinfo"


def _spellings(path: Path) -> set[str]:
    return {str(path), os.path.realpath(path)}


def _bobs_answers(bob: httpx.Client, cluster: str, job: int) -> dict[str, str]:
    """Every answer bob can get about his cluster and job, by route."""
    routes = ["/clusters", f"/clusters/{cluster}", f"/clusters/{cluster}/events", f"/clusters/{cluster}/logs"]
    routes += [f"/jobs/{job}", f"/jobs/{job}/events", f"/jobs/{job}/logs", "/storage", "/me"]
    return {route: bob.get(route).text for route in routes}


def _without(data: Path, answers: dict[str, str]) -> list[str]:
    """The routes whose answer names `data` (any spelling)."""
    return [route for route, text in answers.items() if any(s in text for s in _spellings(data))]


@pytest.mark.attack
def test_a_refused_tenant_file_names_no_server_path(tmp_path: Path) -> None:
    with start_server(tmp_path, ("--reconcile-interval", "0.2", "--insecure-host-commands")) as server:
        bob = server.http(new_user(server, "bob"))
        running_cluster(bob, "bob-leak")
        job = submit_job(bob, "bob-leak", ["sleep", "600"])
        (log,) = server.data.rglob(f"bob-leak/*/var/log/jobs/{job}.log")
        log.unlink()
        os.mkfifo(log)  # what bob's `mkfifo /var/log/jobs/<id>.log` does
        refusal = bob.get(f"/jobs/{job}/logs")
        assert refusal.status_code in (409, 503), refusal.text
        wait_until(lambda: cluster_state(bob, "bob-leak") == "Degraded", 30, "bob's cluster Degraded")
        reason = bob.get("/clusters/bob-leak").json()["reason"]
        assert "FIFO" in reason and "DATA-DIR/" in reason, reason  # says why, relative to the platform
        answers = _bobs_answers(bob, "bob-leak", job)
        assert _without(server.data, answers) == [], {
            r: answers[r][:400] for r in _without(server.data, answers)
        }
        assert any("DATA-DIR/" in e["text"] for e in bob.get("/clusters/bob-leak/events").json())
        log.unlink()
        log.write_text("back\n")
        wait_until(lambda: cluster_state(bob, "bob-leak") == "Running", 30, "bob's cluster recovered")
        bob.delete("/clusters/bob-leak")
        wait_until(lambda: bob.get("/clusters/bob-leak").status_code == 404, 60, "deleted")


@pytest.mark.attack
def test_a_refused_area_start_names_the_area_not_its_path(tmp_path: Path) -> None:
    """Bob's storage area is moved and replaced by a link under his running cluster (an admin's
    clean-up) and a scale needs a new container: the start is refused, naming the area, never where it
    lives."""
    with start_server(
        tmp_path,
        (
            "--reconcile-interval",
            "0.2",
        ),
    ) as server:
        bob = server.http(new_user(server, "bob"))
        assert bob.post("/storage", json={"name": "ckpt"}).status_code == 201
        running_cluster(bob, "bob-area", mounts=["storage:ckpt:/data"])
        (area,) = server.data.glob("storage/u*/ckpt")
        area.rename(area.with_name("ckpt.moved"))
        area.symlink_to(area.with_name("ckpt.moved"))
        assert bob.patch("/clusters/bob-area", json={"containers": 3}).status_code == 200

        def refused_start() -> str:
            cluster = bob.get("/clusters/bob-area").json()
            return " ".join(k["reason"] for k in cluster["containers"] if k["state"] != "Running")

        reason = wait_until(refused_start, 60, "the refused start's reason")
        assert "storage:ckpt now leads elsewhere" in reason, reason
        answers = {
            "cluster": bob.get("/clusters/bob-area").text,
            "events": bob.get("/clusters/bob-area/events").text,
        }
        assert _without(server.data, answers) == [], answers
        area.unlink()
        area.with_name("ckpt.moved").rename(area)
        bob.delete("/clusters/bob-area")
        wait_until(lambda: bob.get("/clusters/bob-area").status_code == 404, 60, "deleted")


def _exec(api: httpx.Client, cluster: str, script: str) -> str:
    answer = api.post(f"/clusters/{cluster}/exec", json={"command": ["sh", "-c", script]}, timeout=120)
    assert answer.status_code == 200, answer.text
    lines = [json.loads(line) for line in answer.text.splitlines() if line.strip()]
    assert lines[-1].get("exit") == 0, lines
    return "".join(str(line.get("out", "")) for line in lines)


@pytest.mark.attack
def test_nothing_in_a_container_names_the_data_dir(tmp_path: Path) -> None:
    need_podman()
    if os.geteuid() != 0:
        pytest.skip("mounting a filesystem at the data directory needs root")
    image = framework_image("pytorch")
    root = tmp_path / "plane"
    (root / "data").mkdir(parents=True)
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256m", "elastrain-test", str(root / "data")], check=True
    )
    try:
        with container_plane(root) as plane:
            bob = plane.http(new_user(plane, "bob"))
            assert bob.post("/storage", json={"name": "ckpt"}).status_code == 201
            running_cluster(bob, "peek", framework="pytorch", image=image, mounts=["storage:ckpt:/data"])
            seen = _exec(bob, "peek", "cat /proc/self/mountinfo; env; tr '\\0' '\\n' < /proc/1/environ")
            assert " /clusters/peek/home /home/bob " in seen and " /storage/u" in seen, seen
            leaked = [line for line in seen.splitlines() if any(s in line for s in _spellings(plane.data))]
            assert leaked == [], leaked
            assert MOUNTINFO_WARNING not in (root / "server.log").read_text()
            bob.delete("/clusters/peek")
            wait_until(lambda: bob.get("/clusters/peek").status_code == 404, 180, "deleted")
    finally:
        subprocess.run(["umount", str(root / "data")], check=False)


def test_the_server_warns_when_containers_could_read_the_path(tmp_path: Path) -> None:
    """Without a filesystem of its own the container backend's server says so at start (one line)."""
    need_podman()
    with container_plane(tmp_path) as plane:
        started = (tmp_path / "server.log").read_text()
        assert f"{plane.data} is not a filesystem of its own" in started and MOUNTINFO_WARNING in started
