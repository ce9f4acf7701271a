"""gpu_type end to end (issue 28 item 5): a real server with virtual GPUs of two models
(``--gpus A100:2,V100:2``); a cluster created with ``--gpu-type`` runs on that model's GPUs only,
shows its type in ``cluster get -o json`` and ``cluster describe``, and a second one asking for the
same (now busy) model, or for a model the node lacks, is refused with a 409 the CLI prints on one line."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from elastrain.testing.clusters import settled
from elastrain.testing.server import ControlPlane

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def typed_cp(tmp_path: Path) -> Iterator[ControlPlane]:
    """A server of its own with two A100s (ids 0-1) and two V100s (ids 2-3); stopped by PID."""
    plane = ControlPlane(tmp_path, gpus="A100:2,V100:2")
    plane.start()
    try:
        yield plane
    finally:
        plane.cleanup()


def test_a_typed_cluster_runs_on_its_model_and_a_busy_or_absent_model_is_refused(
    typed_cp: ControlPlane,
) -> None:
    cp = typed_cp
    created = cp.cli(
        "cluster", "create", "v", "--containers", "2", "--gpus-per-container", "1", "--gpu-type", "V100"
    )
    assert created.returncode == 0, created.stderr
    with cp.client() as c:
        cluster = c.wait_cluster("v", settled(c, "v"), timeout=60)
    assert sorted(g for k in cluster.containers for g in k.gpu_ids) == [2, 3]
    got = json.loads(cp.cli("cluster", "get", "v", "-o", "json").stdout)
    assert got["gpu_type"] == "V100"
    assert re.search(r"^GPU type: +V100$", cp.cli("cluster", "describe", "v").stdout, re.MULTILINE)

    busy = cp.cli("cluster", "create", "v2", "--gpus-per-container", "1", "--gpu-type", "v100")
    assert busy.returncode != 0 and "0 of this node's 2 are free now" in busy.stderr
    assert "Traceback" not in busy.stderr and len(busy.stderr.strip().splitlines()) == 1
    absent = cp.cli("cluster", "create", "h", "--gpus-per-container", "1", "--gpu-type", "H100")
    assert absent.returncode != 0 and "'H100' is not a GPU model of this node" in absent.stderr

    untyped = cp.cli("cluster", "create", "any", "--containers", "2", "--gpus-per-container", "1")
    assert untyped.returncode == 0, untyped.stderr
    with cp.client() as c:
        other = c.wait_cluster("any", settled(c, "any"), timeout=60)
    assert other.gpu_type is None
    assert sorted(g for k in other.containers for g in k.gpu_ids) == [0, 1]  # what the V100 cluster left


def test_the_elastic_scheduler_grows_a_typed_cluster_only_into_its_model(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path, gpus="A100:2,V100:2", extra_args=("--scheduler", "elastic"))
    plane.start()
    try:
        bounds = (
            "--containers",
            "2",
            "--min-containers",
            "2",
            "--max-containers",
            "4",
            "--gpus-per-container",
            "1",
        )
        made = plane.cli("cluster", "create", "a", *bounds, "--gpu-type", "A100")
        assert made.returncode == 0, made.stderr
        with plane.client() as c:
            a = c.wait_cluster("a", settled(c, "a"), timeout=60)
            made = plane.cli("cluster", "create", "b", *bounds)
            assert made.returncode == 0, made.stderr
            b = c.wait_cluster("b", settled(c, "b"), timeout=60)
            a = c.get_cluster("a")
        # a never asks for the V100s (it would wait for them forever); b, of any type, gets them
        assert (a.desired_containers, sorted(g for k in a.containers for g in k.gpu_ids)) == (2, [0, 1])
        assert (b.desired_containers, sorted(g for k in b.containers for g in k.gpu_ids)) == (2, [2, 3])
        assert all(k.state == "Running" for k in a.containers + b.containers)
    finally:
        plane.cleanup()
