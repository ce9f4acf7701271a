"""gpu_type is real (issue 28 item 5): ``--gpus MODEL:N,...`` declares virtual GPUs of named models,
a cluster asking for a model gets GPUs of that model only (the reconcile policy), and a create request
is refused (409) when the node has no GPU of that model, too few, or too few free; the model is
stored and answered (``gpu_type``, null = any)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from elastrain.db.models import Cluster, ClusterState, Container, ContainerState, RestartPolicy
from elastrain.errors import ConfigError
from elastrain.server.gpu_types import free_of_type
from elastrain.server.inventory import Inventory, parse_gpu_spec
from elastrain.server.policy import Action, ClusterView, plan
from elastrain.server.scheduling import cluster_demand
from elastrain.testing.app import AppUnderTest, make_app

NOW = datetime(2026, 1, 1, tzinfo=timezone.utc)
MIXED = "A100:2,V100:2"


def test_gpus_spec_is_a_count_or_models_with_counts() -> None:
    assert parse_gpu_spec("3") == ("", "", "")
    assert parse_gpu_spec(MIXED) == ("A100", "A100", "V100", "V100")
    assert parse_gpu_spec("NVIDIA H100 80GB HBM3:1, 2") == ("NVIDIA H100 80GB HBM3", "", "")
    for bad in ("A100", ":2", "A100:x", "A100:2,,V100:1", "-1"):
        with pytest.raises(ConfigError, match="MODEL:N"):
            parse_gpu_spec(bad)


def test_an_inventory_of_named_models_counts_and_frees_by_model() -> None:
    inv = Inventory.create(MIXED)
    assert (inv.gpus, inv.real, inv.gpu_models, inv.gpu_model) == (4, False, ("A100", "V100"), "A100, V100")
    assert (inv.count("V100"), inv.count("H100"), inv.count(None)) == (2, 0, 4)
    assert inv.free_ids([2], "V100") == [3] and inv.free_ids([2]) == [0, 1, 3]
    untyped = Inventory.create(4)
    assert (untyped.gpus, untyped.gpu_models, untyped.model_of(0)) == (4, (), "")


def view(name: str, containers: int, gpu_type: str | None = None) -> ClusterView:
    return ClusterView(
        name, name, containers, 1, ClusterState.Pending, RestartPolicy.Always, 0, "", "", gpu_type=gpu_type
    )


def placed(decisions: list, cluster: str) -> list[int]:
    return [g for d in decisions if d.action == Action.add and d.cluster == cluster for g in d.gpu_ids]


def test_a_typed_cluster_gets_gpus_of_its_model_and_an_untyped_one_the_unnamed_first() -> None:
    inv = Inventory.create("A100:2,V100:2,2")  # ids 0-1 A100, 2-3 V100, 4-5 of no model
    out = plan([view("v", 2, "V100"), view("any", 2)], [], inv, NOW, timedelta(seconds=3))
    assert placed(out, "v") == [2, 3]
    assert placed(out, "any") == [4, 5]


def test_a_typed_cluster_waits_for_its_model_while_other_gpus_are_free() -> None:
    inv = Inventory.create(MIXED)
    out = plan([view("a", 3, "A100")], [], inv, NOW, timedelta(seconds=3))
    assert placed(out, "a") == []  # a cluster not up yet starts all of its containers or none
    state = [d for d in out if d.action == Action.set_cluster_state]
    assert state[0].reason == "waiting for GPUs: 3 container(s) need 3 A100 GPU(s), 2 of 2 free"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[TestClient, dict[str, str]]]:
    under_test: AppUnderTest = make_app(tmp_path, gpus=MIXED)
    with TestClient(under_test.app) as client:
        yield client, {"Authorization": f"Bearer {under_test.token}"}


def create(client: TestClient, auth: dict[str, str], name: str, **body: object) -> tuple[int, dict]:
    r = client.post("/api/v1/clusters", json={"name": name, "gpus_per_container": 1, **body}, headers=auth)
    return r.status_code, r.json()


def test_gpu_type_is_stored_answered_and_refused_when_absent_too_few_or_busy(
    app: tuple[TestClient, dict[str, str]],
) -> None:
    client, auth = app
    code, body = create(client, auth, "v", gpu_type="v100")  # case aside: the node's spelling is kept
    assert code == 201 and body["gpu_type"] == "V100"
    assert client.get("/api/v1/clusters/v", headers=auth).json()["gpu_type"] == "V100"
    code, body = create(client, auth, "any")
    assert code == 201 and body["gpu_type"] is None
    inventory = client.get("/api/v1/inventory", headers=auth).json()
    assert (inventory["gpu_model"], inventory["gpus"]) == ("A100, V100", 4)
    assert inventory["models"] == [
        {"model": "A100", "gpus": 2, "free": 2},
        {"model": "V100", "gpus": 2, "free": 2},
    ]

    code, body = create(client, auth, "h", gpu_type="H100")
    assert code == 409 and "'H100' is not a GPU model of this node" in body["detail"]
    assert "'A100', 'V100'" in body["detail"]
    code, body = create(client, auth, "big", gpu_type="A100", containers=3)
    assert code == 409 and "3 A100 GPU(s) needed, but this node has 2 of that model" in body["detail"]
    code, body = create(client, auth, "v2", gpu_type="V100")  # "v" holds both V100s
    assert code == 409 and "0 of this node's 2 are free now" in body["detail"]
    assert create(client, auth, "a", gpu_type="A100")[0] == 201  # the other model is still free

    bad = {"name": "Bad_Name", "gpus_per_container": 1, "gpu_type": "H100"}
    r = client.post("/api/v1/clusters", json=bad, headers=auth)
    assert r.status_code == 422  # the request's own values are judged first

    r = client.patch("/api/v1/clusters/v", json={"containers": 3}, headers=auth)
    assert r.status_code == 409 and "this node has 2 of that model" in r.json()["detail"]


def test_the_scheduler_never_grows_a_typed_cluster_beyond_its_models_gpus() -> None:
    row = Cluster(name="a", desired_containers=2, min_containers=2, max_containers=8, gpus_per_container=1)
    counts = Inventory.create("A100:3,V100:5").model_counts()
    assert counts == {"A100": 3, "V100": 5}
    job = [["elastrain", "run", "--min-np", "2", "--max-np", "8", "python", "train.py"]]
    assert cluster_demand(row, (), job, False, counts).max_containers == 8  # any type: the whole node
    row.gpu_type = "A100"
    demand = cluster_demand(row, (), job, False, counts)
    assert (demand.min_containers, demand.max_containers) == (2, 3)


def test_free_gpus_of_a_model_count_what_a_scheduler_can_take_back() -> None:
    inv = Inventory.create(MIXED)
    holder = Cluster(name="b", desired_containers=2, min_containers=1, max_containers=2, gpus_per_container=1)
    holder.state = ClusterState.Running
    holder.containers = [
        Container(name=f"b-{i}", gpu_ids=str(i), state=ContainerState.Running) for i in (0, 1)
    ]  # any type, on both A100s
    assert free_of_type([holder], inv, "A100", elastic=False) == 0  # static: sizes are fixed
    assert free_of_type([holder], inv, "A100", elastic=True) == 1  # shrunk to its minimum of 1
    assert free_of_type([holder], inv, "V100", elastic=False) == 2
    queued = Cluster(name="q", desired_containers=2, gpus_per_container=1, gpu_type="V100", admitted=False)
    queued.state = ClusterState.Pending
    assert free_of_type([holder, queued], inv, "V100", elastic=True) == 0  # promised to the queued one
