"""Every refusal is RFC 9457 problem details, and the OpenAPI document declares what the routes answer.

A real `create_app` in process (tests/security/server_app.py); each refusal is checked for its shape
and media type, and for being a status its operation declares.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from elastrain.server import schemas
from elastrain.server.jobs import JobService
from tests.security.server_app import AppUnderTest, make_app

pytestmark = pytest.mark.timeout(120)
PROBLEM = "application/problem+json"
BASE = "https://elastrain.dev/problems/"
VERBS = ("get", "list", "create", "update", "delete", "scale", "submit", "cancel", "revoke", "report",
         "attach", "exec")  # fmt: skip


@pytest.fixture(scope="module")
def under_test(tmp_path_factory: pytest.TempPathFactory) -> AppUnderTest:
    return make_app(tmp_path_factory.mktemp("problems"), max_body_bytes=4096)


@pytest.fixture(scope="module")
def client(under_test: AppUnderTest) -> Iterator[TestClient]:
    with TestClient(under_test.app, raise_server_exceptions=False) as client:
        yield client


@pytest.fixture(scope="module")
def admin(under_test: AppUnderTest) -> dict[str, str]:
    return {"Authorization": f"Bearer {under_test.token}"}


@pytest.fixture(scope="module")
def document(client: TestClient) -> dict[str, Any]:
    return dict(client.get("/openapi.json").json())


def operation_of(document: dict[str, Any], method: str, path: str) -> dict[str, Any]:
    """The documented operation that routes `method path` (a literal path first, then templates)."""
    paths = document["paths"]
    ordered = sorted(paths, key=lambda t: t.count("{"))
    for template in ordered:
        pattern = re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template))
        if re.fullmatch(pattern, path) and method.lower() in paths[template]:
            return dict(paths[template][method.lower()])
    raise AssertionError(f"{method} {path} is not documented")


def assert_problem(
    response: httpx.Response, status: int, kind: str, path: str, document: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`response` is problem details of `status` and type `kind` about `path` (a declared status)."""
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith(PROBLEM), response.headers
    body = dict(response.json())
    assert body["type"] == BASE + kind
    assert body["status"] == status and body["instance"] == path
    assert body["title"] and body["detail"] and "\n" not in body["detail"]
    assert body["error"] == body["detail"]  # the deprecated member, for old clients
    schemas.ErrorOut.model_validate(body)
    if document is not None:
        operation = operation_of(document, response.request.method, path)
        assert str(status) in operation["responses"], (response.request.method, path, status)
        assert list(operation["responses"][str(status)]["content"]) == [PROBLEM]
    return body


def test_401_from_the_route_and_from_the_body_limit(client: TestClient, document: dict[str, Any]) -> None:
    assert_problem(client.get("/api/v1/me"), 401, "unauthorized", "/api/v1/me", document)
    before_body = client.post("/api/v1/clusters", json={"name": "x"})  # refused before the body is read
    body = assert_problem(before_body, 401, "unauthorized", "/api/v1/clusters", document)
    assert "Bearer" in body["detail"]
    assert "errors" not in body


def test_403_404_409(client: TestClient, admin: dict[str, str], document: dict[str, Any]) -> None:
    created = client.post("/api/v1/users", json={"name": "bob"}, headers=admin)
    assert created.status_code == 201, created.text
    assert created.headers["location"] == "/api/v1/users/bob"
    bob = {"Authorization": f"Bearer {created.json()['token']}"}
    not_admin = client.post("/api/v1/users", json={"name": "eve"}, headers=bob)
    assert_problem(not_admin, 403, "forbidden", "/api/v1/users", document)
    for path in ("/api/v1/clusters/nope", "/api/v1/jobs/12345", "/api/v1/users/nobody"):
        assert_problem(client.get(path, headers=admin), 404, "not-found", path, document)
    again = client.post("/api/v1/users", json={"name": "bob"}, headers=admin)
    assert "exists" in assert_problem(again, 409, "conflict", "/api/v1/users", document)["detail"]


def test_404_of_an_unknown_route(client: TestClient) -> None:
    body = assert_problem(client.get("/api/v1/no-such-thing"), 404, "not-found", "/api/v1/no-such-thing")
    assert "/api/v1/no-such-thing" in body["detail"]


def test_413(client: TestClient, admin: dict[str, str], document: dict[str, Any]) -> None:
    big = client.post("/api/v1/clusters", content=b"{" + b" " * 8000 + b"}", headers=admin)
    body = assert_problem(big, 413, "too-large", "/api/v1/clusters", document)
    assert "4096 bytes" in body["detail"]


def test_422_names_every_bad_field(
    client: TestClient, admin: dict[str, str], document: dict[str, Any]
) -> None:
    bad = client.post("/api/v1/clusters", json={"name": "", "containers": 0, "shm": "lots"}, headers=admin)
    body = assert_problem(bad, 422, "validation", "/api/v1/clusters", document)
    locs = [e["loc"] for e in body["errors"]]
    assert {"body.name", "body.containers", "body.shm"} <= set(locs), body
    assert all(e["message"] for e in body["errors"])
    for field in ("name", "containers", "shm"):
        assert field in body["detail"]


def test_422_of_the_service_checks_names_every_field(client: TestClient, admin: dict[str, str]) -> None:
    """Values wrong together (shm over memory, two mounts on one target) are listed with the others;
    what this node refuses of a valid request (GPUs it lacks, mount sources) waits for them."""
    mount = "/nonexistent/elastrain-test:/data"
    request = {"name": "fine", "gpus_per_container": 1, "shm": "2Gi", "memory": "1Gi", "mounts": [mount] * 2}
    answer = client.post("/api/v1/clusters", json=request, headers=admin)
    body = assert_problem(answer, 422, "validation", "/api/v1/clusters")
    messages = {e["loc"]: e["message"] for e in body["errors"]}
    assert set(messages) == {"body.shm", "body.mounts"}, body
    assert "memory limit" in messages["body.shm"] and "share a target" in messages["body.mounts"]
    assert client.get("/api/v1/clusters/fine", headers=admin).status_code == 404  # nothing was created


def test_what_the_node_refuses_of_a_valid_create_is_403_or_409(
    client: TestClient, admin: dict[str, str], document: dict[str, Any]
) -> None:
    """Schema-valid values the node cannot serve: not a 422 (the request is right, the node is not)."""
    for extra, status, kind, message in [
        ({"gpus_per_container": 1}, 409, "conflict", "0 virtual GPUs"),
        ({"mounts": ["/etc:/data"]}, 403, "forbidden", "outside the allowed roots"),
    ]:
        answer = client.post("/api/v1/clusters", json={"name": "fine", **extra}, headers=admin)
        body = assert_problem(answer, status, kind, "/api/v1/clusters", document)
        assert message in body["detail"], body
    assert client.get("/api/v1/clusters/fine", headers=admin).status_code == 404  # nothing was created


def test_422_of_a_path_and_a_query_value(client: TestClient, admin: dict[str, str]) -> None:
    path = "/api/v1/jobs/0/logs"
    body = assert_problem(client.get(path, params={"offset": -1}, headers=admin), 422, "validation", path)
    assert {e["loc"] for e in body["errors"]} == {"path.job_id", "query.offset"}


def test_405_carries_allow(client: TestClient, admin: dict[str, str]) -> None:
    for method, path, allow in [
        ("PUT", "/api/v1/clusters", "GET, POST"),
        ("POST", "/api/v1/clusters/x", "GET, PATCH, DELETE"),
        ("DELETE", "/api/v1/healthz", "GET"),
        ("OPTIONS", "/api/v1/jobs/attach", "POST"),  # not /jobs/{job_id}: job_id is an integer
        ("GET", "/api/v1/jobs/attach", "POST"),
        ("PUT", "/api/v1/jobs/7", "GET, DELETE"),
    ]:
        answer = client.request(method, path, headers=admin)
        body = assert_problem(answer, 405, "method-not-allowed", path)
        assert answer.headers["allow"] == allow, (method, path)
        assert allow in body["detail"]


def test_500_is_a_problem_without_the_traceback(under_test: AppUnderTest, client: TestClient) -> None:
    def boom() -> None:
        raise RuntimeError("secret internals")

    under_test.app.add_api_route("/api/v1/test-boom", boom, include_in_schema=False)
    body = assert_problem(client.get("/api/v1/test-boom"), 500, "internal", "/api/v1/test-boom")
    assert body["detail"] == "internal error: RuntimeError" and "secret" not in str(body)


def test_creates_answer_201_with_location(
    client: TestClient, admin: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    cluster = client.post("/api/v1/clusters", json={"name": "loc1", "containers": 2}, headers=admin)
    assert cluster.status_code == 201 and cluster.headers["location"] == "/api/v1/clusters/loc1"
    assert client.get(cluster.headers["location"], headers=admin).json()["name"] == "loc1"
    token = client.post("/api/v1/users/admin/tokens", json={"name": "ci"}, headers=admin)
    assert token.status_code == 201
    assert token.headers["location"] == f"/api/v1/users/admin/tokens/{token.json()['id']}"

    def submitted(_self: JobService, _user: object, name: str, req: schemas.JobSubmit) -> schemas.JobOut:
        return schemas.JobOut.model_validate({
            "id": 7, "cluster": name, "command": list(req.command), "status": "Running", "pid": None,
            "exit_code": None, "step": None, "epoch": None, "loss": None, "samples_per_s": None,
            "world_size": None, "created_at": "2030-01-01T00:00:00Z", "finished_at": None,
        })  # fmt: skip

    monkeypatch.setattr(JobService, "submit", submitted)
    job = client.post("/api/v1/clusters/loc1/jobs", json={"command": ["hostname"]}, headers=admin)
    assert job.status_code == 201 and job.headers["location"] == "/api/v1/jobs/7"


def test_delete_is_202_and_the_cluster_stays_readable_as_terminating(
    client: TestClient, admin: dict[str, str], document: dict[str, Any]
) -> None:
    assert client.post("/api/v1/clusters", json={"name": "gone1"}, headers=admin).status_code == 201
    deleted = client.delete("/api/v1/clusters/gone1", headers=admin)
    assert deleted.status_code == 202 and deleted.json()["state"] == "Terminating"
    assert client.get("/api/v1/clusters/gone1", headers=admin).json()["state"] == "Terminating"
    description = document["paths"]["/api/v1/clusters/{name}"]["delete"]["description"]
    assert "Terminating" in description and "202" in description


def test_operation_ids_are_unique_camel_case_verbs(document: dict[str, Any]) -> None:
    ids = [op["operationId"] for item in document["paths"].values() for op in item.values()]
    assert len(ids) == len(set(ids)), ids
    for op_id in ids:
        assert re.fullmatch(r"[a-z]+(?:[A-Z][a-z0-9]*)*", op_id), op_id
        assert re.match(r"[a-z]+", op_id).group() in VERBS, op_id  # type: ignore[union-attr]
    assert {"createCluster", "listClusters", "getJob", "deleteCluster", "getJobLogs"} <= set(ids)


def test_every_route_declares_its_statuses_and_media_types(document: dict[str, Any]) -> None:
    for path, item in document["paths"].items():
        for method, op in item.items():
            where, codes = f"{method.upper()} {path}", set(op["responses"])
            secured = bool(op.get("security"))
            if secured:
                assert "401" in codes, where
            if "requestBody" in op:
                assert {"401", "413", "422"} <= codes, where
                assert op["requestBody"]["content"]["application/json"].get("examples"), where
            if secured and "{" in path:
                assert "404" in codes, where
            if any(p["in"] in ("path", "query") for p in op.get("parameters", [])) or "requestBody" in op:
                assert "422" in codes, where
            for code, response in op["responses"].items():
                if code[0] in "45":
                    assert list(response["content"]) == [PROBLEM], (where, code)
                assert "X-Request-ID" in response.get("headers", {}), (where, code)
            assert op.get("tags"), where
    assert "HTTPValidationError" not in document["components"]["schemas"]


def test_media_types_and_headers_of_the_text_and_stream_routes(document: dict[str, Any]) -> None:
    paths = document["paths"]
    for path in ("/api/v1/clusters/{name}/hostfile", "/api/v1/clusters/{name}/logs"):
        assert list(paths[path]["get"]["responses"]["200"]["content"]) == ["text/plain"], path
    logs = paths["/api/v1/jobs/{job_id}/logs"]["get"]["responses"]["200"]
    assert list(logs["content"]) == ["text/plain"]
    assert {"X-Next-Offset", "X-Job-Status"} <= set(logs["headers"])
    exec_line = paths["/api/v1/clusters/{name}/exec"]["post"]["responses"]["200"]["content"]
    assert set(exec_line["application/x-ndjson"]["schema"]["properties"]) == {"out", "exit"}
    for path, method in [
        ("/api/v1/clusters", "post"),
        ("/api/v1/users", "post"),
        ("/api/v1/users/{name}/tokens", "post"),
        ("/api/v1/clusters/{name}/jobs", "post"),
    ]:
        created = paths[path][method]["responses"]["201"]
        assert "Location" in created["headers"], path


def test_a_body_that_is_not_json_is_one_field_error(client: TestClient, admin: dict[str, str]) -> None:
    headers = {**admin, "content-type": "application/json"}
    answer = client.post("/api/v1/clusters", content=b"{not json", headers=headers)
    body = assert_problem(answer, 422, "validation", "/api/v1/clusters")
    assert [e["loc"] for e in body["errors"]] == ["body"]
    assert "not valid JSON" in body["detail"]


def test_a_body_that_is_not_utf8_is_one_field_error(client: TestClient, admin: dict[str, str]) -> None:
    headers = {**admin, "content-type": "application/json"}
    answer = client.post("/api/v1/clusters", content=b'{"name": "\xff"}', headers=headers)
    body = assert_problem(answer, 422, "validation", "/api/v1/clusters")
    assert [e["loc"] for e in body["errors"]] == ["body"] and "UTF-8" in body["detail"]


def test_integer_bounds_are_exact_ints(document: dict[str, Any]) -> None:
    """FastAPI writes bounds as floats (2**63 - 1 becomes 9.223372036854776e+18, i.e. 2**63)."""
    checkpoint = document["components"]["schemas"]["CheckpointOut"]["properties"]["step"]
    assert checkpoint["maximum"] == schemas.MAX_DB_INT and type(checkpoint["maximum"]) is int
    assert checkpoint["minimum"] == 0 and type(checkpoint["minimum"]) is int
    job_id = next(p for p in document["paths"]["/api/v1/jobs/{job_id}"]["get"]["parameters"])
    assert job_id["schema"]["maximum"] == schemas.MAX_DB_INT
