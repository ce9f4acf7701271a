"""``GET /metrics`` and container usage on real servers.

- a scrape parses with prometheus_client's parser; every name is ``elastrain_``-prefixed; the Grafana
  dashboard only queries names the server exports;
- a running elastic job's world size appears there and follows a scale 2 -> 3;
- with a metrics token configured, a scrape without it is 401;
- the container backend: cgroup figures for every running container (skips where podman is missing).
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from elastrain.testing.clusters import all_running, settled
from elastrain.testing.containers import container_plane, need_podman
from elastrain.testing.jobs import REPO
from elastrain.testing.server import ControlPlane, sqlite_only
from elastrain.testing.waits import wait_until

pytestmark = pytest.mark.timeout(300)
DASHBOARD = REPO / "docs" / "grafana-dashboard.json"
SUFFIXES = ("_total", "_bucket", "_count", "_sum", "_created")


def scrape(url: str, token: str | None = None) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Sample name -> [(labels, value)] of one scrape (parsed by prometheus_client's parser)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answer = httpx.get(url + "/metrics", headers=headers, timeout=30)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("text/plain")
    found: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(answer.text):
        assert family.name.startswith("elastrain_"), family.name
        found.setdefault(family.name, [])  # a family without samples yet (no GPU, no job) is exported too
        for sample in family.samples:
            found.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return found


def value(samples: dict[str, list[tuple[dict[str, str], float]]], name: str, **labels: str) -> float | None:
    """The value of the one sample of `name` with `labels` (None when there is none)."""
    matching = [v for got, v in samples.get(name, []) if all(got.get(k) == w for k, w in labels.items())]
    assert len(matching) <= 1, (name, labels, matching)
    return matching[0] if matching else None


def base_name(name: str) -> str:
    """`name` without the suffix of a counter's or a histogram's samples."""
    return re.sub("(" + "|".join(SUFFIXES) + ")$", "", name)


def dashboard_names() -> set[str]:
    """The metric names the Grafana dashboard's queries use (without sample suffixes)."""
    model = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in model["panels"] for t in p.get("targets", [])]
    return {base_name(name) for expr in exprs for name in re.findall(r"\belastrain_[a-z_]+", expr)}


def test_job_world_size_follows_a_scale_and_every_dashboard_series_exists(cp: ControlPlane) -> None:
    sqlite_only(cp)
    examples = cp.mounts / "metrics-examples"  # a copy: a symlink out of the allowed root is refused
    examples.mkdir(exist_ok=True)
    for name in ("mnist_elastic.py", "mnist1d_data.py"):
        shutil.copy(REPO / "examples" / name, examples / name)
    with cp.client() as c:
        c.create_cluster("metrics", containers=2, gpus_per_container=1, mounts=[f"{examples}:/examples"])
        c.wait_cluster("metrics", settled(c, "metrics"))
        run = "elastrain run -v --min-np 1 --max-np 3 --hostfile /etc/mpi/hostfile --join-grace 1"
        train = "python /examples/mnist_elastic.py --epochs 100 --batch-size 256 --step-sleep 0.02"
        job = c.submit_job("metrics", f"{run} {train}".split())
        labels = {"cluster": "metrics", "job": str(job["id"])}

        def world(size: int) -> bool:
            got = value(scrape(cp.url), "elastrain_job_world_size", **labels)
            assert c.get_job(job["id"])["status"] == "Running", c.job_logs(job["id"])[0][-3000:]
            return got == size

        wait_until(lambda: world(2), 120, "/metrics to show the job training with 2 workers", interval=0.5)
        c.scale_cluster("metrics", 3)
        wait_until(lambda: world(3), 120, "/metrics to show the job grown to 3 workers", interval=0.5)

        wait_until(
            lambda: (
                (value(scrape(cp.url), "elastrain_job_incidents_total", cause="scale_out", **labels) or 0)
                >= 1
            ),
            60,
            "the scale-out incident to be counted",
            interval=0.5,
        )
        samples = scrape(cp.url)
        assert value(samples, "elastrain_job_running", **labels) == 1
        assert (value(samples, "elastrain_job_step", **labels) or 0) > 0
        assert (value(samples, "elastrain_job_pauses_total", **labels) or 0) >= 1
        assert value(samples, "elastrain_cluster_desired_containers", cluster="metrics") == 3
        assert value(samples, "elastrain_jobs", status="Running") == 1
        assert value(samples, "elastrain_gpu_devices") is not None
        assert (value(samples, "elastrain_reconcile_pass_seconds_count") or 0) > 0
        assert value(samples, "elastrain_scheduler_decisions_total", decision="rescheduled") == 0  # static
        assert any(
            s.get("handler") == "/api/v1/clusters/{name}" for s, _ in samples["elastrain_http_requests_total"]
        )
        exported = {base_name(n) for n in samples}
        assert dashboard_names() <= exported, dashboard_names() - exported

        # the process backend: the figures of each container's live processes, from /proc
        with cp.http() as http:
            usage = http.get("/clusters/metrics/usage").raise_for_status().json()
        for container in usage["containers"]:
            assert container["source"] == "processes", container
            assert container["cpu_seconds"] > 0 and container["memory_bytes"] > 0, container
            name = container["name"]
            assert value(samples, "elastrain_container_cpu_seconds_total", cluster="metrics", container=name)
        c.delete_cluster("metrics")
        c.wait_deleted("metrics")


def test_a_scrape_without_the_configured_token_is_401(tmp_path: Path) -> None:
    token = "metrics-token-0123456789"
    env = {k: v for k, v in os.environ.items() if k.upper() != "ELASTRAIN_DB"}
    plane = ControlPlane(tmp_path, env={**env, "ELASTRAIN_METRICS_TOKEN": token})
    plane.start()
    try:
        for headers in (
            {},
            {"Authorization": "Bearer wrong-token"},
            {"Authorization": f"Bearer {plane.token}"},
        ):
            refused = httpx.get(plane.url + "/metrics", headers=headers, timeout=10)
            assert refused.status_code == 401, refused.text
            assert refused.headers["content-type"] == "application/problem+json"
            assert "metrics token" in refused.json()["detail"]
        assert "elastrain_clusters" in scrape(plane.url, token)
    finally:
        plane.cleanup()


def test_cgroup_figures_for_every_running_container(tmp_path: Path) -> None:
    need_podman()
    with container_plane(tmp_path) as plane, plane.client() as c:
        c.create_cluster("usage", framework="pytorch", containers=2, memory="1Gi")
        c.wait_cluster("usage", all_running)
        with plane.http() as http:
            usage = http.get("/clusters/usage/usage").raise_for_status().json()
        running = [k.name for k in c.get_cluster("usage").containers if k.state == "Running"]
        assert sorted(k["name"] for k in usage["containers"]) == sorted(running) and len(running) == 2
        for container in usage["containers"]:
            assert container["source"] == "cgroup", container
            assert container["cpu_seconds"] > 0 and container["memory_bytes"] > 0, container
            assert container["memory_limit_bytes"] == 1 << 30, container
            assert container["cpu_percent"] is not None and container["cpu_percent"] >= 0, container
        samples = scrape(plane.url)
        for name in running:
            assert value(samples, "elastrain_container_cpu_seconds_total", cluster="usage", container=name)
            assert (
                value(samples, "elastrain_container_memory_limit_bytes", cluster="usage", container=name)
                == 1 << 30
            )
        c.delete_cluster("usage")
        c.wait_deleted("usage")


def test_the_dashboard_is_a_grafana_model_on_a_prometheus_datasource_variable() -> None:
    model = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in model["templating"]["list"]}
    assert (
        variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    )
    panels = [p for p in model["panels"] if p["type"] != "row"]
    assert panels and all(p["datasource"]["uid"] == "${datasource}" for p in panels)
    assert all(t["expr"] and t["refId"] for p in panels for t in p["targets"])
    assert {"uid", "title", "schemaVersion", "panels", "templating"} <= set(model)


def test_the_metrics_token_setting_is_checked_and_never_echoed(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from elastrain.cli.main import build_parser
    from elastrain.errors import ConfigError
    from elastrain.server.settings import load_settings

    monkeypatch.setenv("ELASTRAIN_METRICS_TOKEN", "from-the-environment-1234")
    assert load_settings(build_parser().parse_args(["server"])).metrics_token == "from-the-environment-1234"
    flagged = load_settings(build_parser().parse_args(["server", "--metrics-token", "from-the-flag-123456"]))
    assert (
        flagged.metrics_token == "from-the-flag-123456" and "visible to every user" in capsys.readouterr().err
    )
    with pytest.raises(ConfigError, match="ELASTRAIN_METRICS_TOKEN") as refused:
        load_settings(build_parser().parse_args(["server", "--metrics-token", "short-secret"]))
    assert "short-secret" not in str(refused.value)
